//! A plan (an image's or a video's) as a Python dict.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use serde_json::Value;

use vision_towers::vision_prep::{Plan, VideoPiece, VideoPlan};

/// `Plan::to_json` as Python values (`target` and each prompt run a tuple), plus `is_embed`:
/// one bool per prompt token, `True` where the token receives a row.
pub fn to_dict<'py>(py: Python<'py>, plan: &Plan) -> PyResult<Bound<'py, PyAny>> {
    let d = json(py, &plan.to_json())?.cast_into::<PyDict>()?;
    d.set_item("target", (plan.target.0, plan.target.1))?;
    let runs: Vec<Bound<'py, PyTuple>> = plan
        .prompt_runs
        .iter()
        .map(|r| {
            PyTuple::new(
                py,
                [
                    r.token.id.into_pyobject(py)?.into_any(),
                    r.count.into_pyobject(py)?.into_any(),
                ],
            )
        })
        .collect::<PyResult<_>>()?;
    d.set_item("prompt_runs", PyList::new(py, runs)?)?;
    d.set_item("is_embed", plan.is_embed())?;
    Ok(d.into_any())
}

/// `VideoPlan::to_json` as Python values: `target` and `content` tuples, `prompt` the pieces in
/// order (a token run a `(token_id, count, embeds)` tuple, text a `str`), plus `prompt_runs`
/// (`(token_id, count)` of the token runs alone, in order) and `is_embed` (one bool per token of
/// those runs, `True` where it receives a row; the text pieces are the caller's to tokenize).
pub fn video_to_dict<'py>(py: Python<'py>, plan: &VideoPlan) -> PyResult<Bound<'py, PyAny>> {
    let d = json(py, &plan.to_json())?.cast_into::<PyDict>()?;
    d.set_item("target", (plan.target.0, plan.target.1))?;
    d.set_item("content", (plan.content.0, plan.content.1))?;
    let mut pieces: Vec<Bound<'py, PyAny>> = Vec::with_capacity(plan.prompt.len());
    let mut runs: Vec<Bound<'py, PyTuple>> = Vec::new();
    let mut is_embed: Vec<bool> = Vec::new();
    for p in &plan.prompt {
        match p {
            VideoPiece::Run(r) => {
                let id = r.token.id.into_pyobject(py)?.into_any();
                let count = r.count.into_pyobject(py)?.into_any();
                let embeds = r.embeds.into_pyobject(py)?.to_owned().into_any();
                pieces.push(PyTuple::new(py, [id.clone(), count.clone(), embeds])?.into_any());
                runs.push(PyTuple::new(py, [id, count])?);
                is_embed.extend(std::iter::repeat_n(
                    r.embeds,
                    usize::try_from(r.count).unwrap_or(0),
                ));
            }
            VideoPiece::Text(t) => pieces.push(t.into_pyobject(py)?.into_any()),
        }
    }
    d.set_item("prompt", PyList::new(py, pieces)?)?;
    d.set_item("prompt_runs", PyList::new(py, runs)?)?;
    d.set_item("is_embed", is_embed)?;
    Ok(d.into_any())
}

/// A JSON value as Python values.
fn json<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.into_pyobject(py)?.into_any(),
            (_, Some(i), _) => i.into_pyobject(py)?.into_any(),
            (_, _, f) => f.unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(a) => {
            let items = a
                .iter()
                .map(|x| json(py, x))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, json(py, x)?)?;
            }
            d.into_any()
        }
    })
}
