//! Pipelined encoding of a stream of images ([`Model::encode_stream`]).
//!
//! Two threads: a producer pulls images from the caller's iterator, admits, decodes and prepares
//! them in parallel (rayon), cuts them into passes by the [`BatchPolicy`] and builds each pass's
//! tower input (on CUDA already in the GEMM precision); the calling thread holds the tower and,
//! for each pass, stages it (on CUDA: an asynchronous upload from page-locked memory on a copy
//! stream), launches it behind the pass in flight, then collects the rows of the pass before it
//! and hands them to the sink. So pass k+1 is decoded and uploaded while pass k runs on the
//! device, and pass k's rows are read back while pass k+1 runs.
//!
//! Order and errors: results reach the sink in input order, one per image. An image refused by
//! admission, decoding or the processor, or over the patch ceiling, is an `Err` for its index and
//! the stream goes on. A pass that fails on the device (out of memory, a driver error) stops the
//! stream: [`Model::encode_stream`] returns the error naming that pass's images, and no later
//! image reaches the sink.
//!
//! Memory: one pass waits between the threads, so at most about five passes' worth of images
//! are held at once (the producer's chunk and its open pass, the one waiting, the one staged and
//! launched, the one on the device, whose rows are read back next), whatever the stream's length.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::Instant;

use rayon::prelude::*;
use vision_prep::{ImageSource, Plan, Prepared};

use crate::engine::Inputs;
use crate::model::{Encoded, Model, ModelError};
use crate::session::{PassMaker, PassTicket, StreamSession};
use crate::tower_error::InputError;
use crate::{TowerError, DEFAULT_MAX_PATCHES_PER_PASS};

/// How a stream of images is cut into passes: consecutive images, whole, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPolicy {
    /// The most images in one pass (at least 1).
    pub max_images: usize,
    /// The most patches in one pass (at least 1); the tower's `max_patches_per_pass` caps it.
    pub max_patches: usize,
}

impl Default for BatchPolicy {
    fn default() -> BatchPolicy {
        BatchPolicy {
            max_images: 8,
            max_patches: DEFAULT_MAX_PATCHES_PER_PASS,
        }
    }
}

/// One pass of a stream: its first image, how many, and their patches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassStat {
    /// Index of its first image in the stream.
    pub first: usize,
    /// Images in it.
    pub images: usize,
    /// Patches in it.
    pub patches: usize,
}

/// What a stream did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamStats {
    /// Images whose rows reached the sink.
    pub encoded: usize,
    /// Images that reached the sink as an error.
    pub failed: usize,
    /// The passes, in order.
    pub passes: Vec<PassStat>,
    /// Seconds from the call to the last result.
    pub wall_s: f64,
    /// Seconds the device's thread waited for the next pass (the producer was behind).
    pub waited_for_input_s: f64,
    /// Seconds the producer waited for room (the device was behind).
    pub waited_for_device_s: f64,
}

/// What travels from the producer to the device's thread, in input order.
enum Unit {
    Pass {
        first: usize,
        plans: Vec<Plan>,
        patches: usize,
        input: PassTicket,
    },
    Failed {
        index: usize,
        error: ModelError,
    },
    /// Building a pass's input failed: the stream stops.
    Broken {
        first: usize,
        last: usize,
        error: InputError,
    },
}

/// The producer's open pass.
#[derive(Default)]
struct Open {
    first: usize,
    prepared: Vec<Prepared>,
    patches: usize,
}

impl BatchPolicy {
    fn check(&self) -> Result<(), ModelError> {
        if self.max_images == 0 || self.max_patches == 0 {
            return Err(ModelError::Tower(TowerError::Unsupported(format!(
                "a batch policy needs at least one image and one patch per pass, got {self:?}"
            ))));
        }
        Ok(())
    }
}

impl Model {
    /// Encodes a stream of images (their bytes, any format `encode` takes) pass by pass with the
    /// next pass decoded, prepared and uploaded while the current one runs, and hands each
    /// image's result to `sink(index, result)` in input order (see the module docs for errors
    /// and memory). On CUDA the stream holds the device for its whole run: other calls on this
    /// model wait until it ends, so `sink` must not call this model's `encode` or the tower's
    /// graph accessors (it would wait on itself). Returns what the stream did, or the error of
    /// the pass that stopped it.
    pub fn encode_stream<I, B, F>(
        &self,
        images: I,
        policy: BatchPolicy,
        mut sink: F,
    ) -> Result<StreamStats, ModelError>
    where
        I: IntoIterator<Item = B>,
        I::IntoIter: Send,
        B: AsRef<[u8]> + Send,
        F: FnMut(usize, Result<Encoded, ModelError>),
    {
        policy.check()?;
        let t0 = Instant::now();
        let ceiling = policy.max_patches.min(self.tower().max_patches_per_pass());
        let (tx, rx) = sync_channel::<Unit>(1);
        let mut it = images.into_iter();
        let (mut maker, mut session) = self.tower().stream();
        std::thread::scope(|scope| {
            let producer = scope
                .spawn(move || self.produce(&mut it, policy.max_images, ceiling, &mut *maker, tx));
            let mut stats = StreamStats::default();
            let r = self.consume(rx, &mut *session, &mut sink, &mut stats);
            match producer.join() {
                Ok(waited) => stats.waited_for_device_s = waited,
                Err(panic) => std::panic::resume_unwind(panic),
            }
            stats.wall_s = t0.elapsed().as_secs_f64();
            r.map(|()| stats)
        })
    }

    /// The producer: chunks of `max_images` images prepared in parallel, cut into passes.
    /// Returns the seconds it waited for room in the channel.
    fn produce<B: AsRef<[u8]> + Send>(
        &self,
        it: &mut (impl Iterator<Item = B> + Send),
        max_images: usize,
        ceiling: usize,
        maker: &mut dyn PassMaker,
        tx: SyncSender<Unit>,
    ) -> f64 {
        let mut waited = 0.0;
        let mut send = |u: Unit| -> bool {
            let t = Instant::now();
            let ok = tx.send(u).is_ok();
            waited += t.elapsed().as_secs_f64();
            ok
        };
        let mut next = 0usize;
        let mut open = Open::default();
        loop {
            let chunk: Vec<(usize, B)> = it
                .by_ref()
                .take(max_images)
                .enumerate()
                .map(|(i, b)| (next + i, b))
                .collect();
            if chunk.is_empty() {
                break;
            }
            next += chunk.len();
            let prepared: Vec<(usize, Result<Prepared, vision_prep::PrepError>)> = chunk
                .into_par_iter()
                .map(|(i, b)| {
                    (
                        i,
                        self.preprocessor().prepare(ImageSource::Bytes(b.as_ref())),
                    )
                })
                .collect();
            for (index, r) in prepared {
                let p = match r {
                    Ok(p) => p,
                    Err(source) => {
                        if !self.flush(&mut open, maker, &mut send)
                            || !send(Unit::Failed {
                                index,
                                error: ModelError::Image { index, source },
                            })
                        {
                            return waited;
                        }
                        continue;
                    }
                };
                let patches = match self.patches_of(&p) {
                    Ok(n) => n,
                    Err(e) => {
                        let error = ModelError::of_images(e.at(self.path()));
                        if !self.flush(&mut open, maker, &mut send)
                            || !send(Unit::Failed { index, error })
                        {
                            return waited;
                        }
                        continue;
                    }
                };
                if patches > ceiling {
                    let error = ModelError::Tower(TowerError::OverPassCeiling {
                        path: self.path().to_path_buf(),
                        index,
                        patches,
                        ceiling,
                    });
                    if !self.flush(&mut open, maker, &mut send)
                        || !send(Unit::Failed { index, error })
                    {
                        return waited;
                    }
                    continue;
                }
                if !open.prepared.is_empty()
                    && (open.prepared.len() >= max_images || open.patches + patches > ceiling)
                    && !self.flush(&mut open, maker, &mut send)
                {
                    return waited;
                }
                if open.prepared.is_empty() {
                    open.first = index;
                }
                open.prepared.push(p);
                open.patches += patches;
            }
        }
        self.flush(&mut open, maker, &mut send);
        waited
    }

    /// Sends the open pass (if any) and starts an empty one; false when the stream is over.
    fn flush(
        &self,
        open: &mut Open,
        maker: &mut dyn PassMaker,
        send: &mut impl FnMut(Unit) -> bool,
    ) -> bool {
        if open.prepared.is_empty() {
            return true;
        }
        let Open {
            first,
            prepared,
            patches,
        } = std::mem::take(open);
        let last = first + prepared.len() - 1;
        let plans: Vec<Plan> = prepared.iter().map(|p| p.plan.clone()).collect();
        match maker.make(prepared) {
            Ok((input, done)) => {
                // their rows now live in the pass input: the next images write into their buffers
                for p in done {
                    self.preprocessor().recycle(p);
                }
                send(Unit::Pass {
                    first,
                    plans,
                    patches,
                    input,
                })
            }
            Err(error) => {
                send(Unit::Broken { first, last, error });
                false
            }
        }
    }

    fn patches_of(&self, p: &Prepared) -> Result<usize, InputError> {
        let patches = self
            .tower()
            .patches(Inputs::Prepared(std::slice::from_ref(p)))?;
        Ok(patches.first().copied().unwrap_or(0))
    }

    /// A pass's failure, naming its images.
    fn pass_err(&self, first: usize, last: usize, e: InputError) -> ModelError {
        ModelError::of_images(TowerError::Pass {
            first,
            last,
            source: Box::new(e.at(self.path())),
        })
    }

    /// Hands a finished pass's rows to the sink, image by image.
    fn deliver(
        &self,
        (first, plans): (usize, Vec<Plan>),
        rows: Option<Vec<Vec<f32>>>,
        sink: &mut impl FnMut(usize, Result<Encoded, ModelError>),
        stats: &mut StreamStats,
    ) -> Result<(), ModelError> {
        let last = first + plans.len().saturating_sub(1);
        let rows = rows.ok_or_else(|| {
            self.pass_err(first, last, InputError::Message("no rows came back".into()))
        })?;
        if rows.len() != plans.len() {
            return Err(self.pass_err(
                first,
                last,
                InputError::Message(format!(
                    "{} images gave {} blocks of rows",
                    plans.len(),
                    rows.len()
                )),
            ));
        }
        let width = self.tower().width();
        for (i, (plan, r)) in plans.into_iter().zip(rows).enumerate() {
            let index = first + i;
            let got = r.len() / width.max(1);
            let result = if got == plan.rows as usize {
                stats.encoded += 1;
                Ok(Encoded {
                    plan,
                    rows: r,
                    width,
                })
            } else {
                stats.failed += 1;
                Err(ModelError::RowsOffPlan {
                    index,
                    got,
                    planned: plan.rows as usize,
                })
            };
            sink(index, result);
        }
        Ok(())
    }

    /// The device's thread: stage each pass, collect the one before, launch it.
    fn consume(
        &self,
        rx: Receiver<Unit>,
        session: &mut dyn StreamSession,
        sink: &mut impl FnMut(usize, Result<Encoded, ModelError>),
        stats: &mut StreamStats,
    ) -> Result<(), ModelError> {
        let mut in_flight: VecDeque<(usize, Vec<Plan>)> = VecDeque::new();
        let span = |(f, p): &(usize, Vec<Plan>)| (*f, f + p.len().saturating_sub(1));
        loop {
            let t = Instant::now();
            let Ok(unit) = rx.recv() else { break };
            stats.waited_for_input_s += t.elapsed().as_secs_f64();
            match unit {
                Unit::Pass {
                    first,
                    plans,
                    patches,
                    input,
                } => {
                    let last = first + plans.len().saturating_sub(1);
                    session
                        .stage(input, patches)
                        .map_err(|e| self.pass_err(first, last, e))?;
                    // Launch this pass behind the one in flight, then read the previous pass's
                    // rows back and hand them to the sink while the device runs this one: the
                    // device goes from pass to pass without waiting for the host.
                    let launched = session.launch(patches);
                    if let Some(prev) = in_flight.pop_front() {
                        let (f, l) = span(&prev);
                        let rows = session.collect().map_err(|e| self.pass_err(f, l, e))?;
                        self.deliver(prev, rows, sink, stats)?;
                    }
                    launched.map_err(|e| self.pass_err(first, last, e))?;
                    stats.passes.push(PassStat {
                        first,
                        images: plans.len(),
                        patches,
                    });
                    in_flight.push_back((first, plans));
                }
                Unit::Failed { index, error } => {
                    if let Some(prev) = in_flight.pop_front() {
                        let (f, l) = span(&prev);
                        let rows = session.collect().map_err(|e| self.pass_err(f, l, e))?;
                        self.deliver(prev, rows, sink, stats)?;
                    }
                    stats.failed += 1;
                    sink(index, Err(error));
                }
                Unit::Broken { first, last, error } => {
                    return Err(self.pass_err(first, last, error))
                }
            }
        }
        if let Some(prev) = in_flight.pop_front() {
            let (f, l) = span(&prev);
            let rows = session.collect().map_err(|e| self.pass_err(f, l, e))?;
            self.deliver(prev, rows, sink, stats)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::path::Path;
    use std::sync::mpsc::sync_channel;

    use vision_prep::{ImageSource, Plan, PrepSettings};

    use super::{StreamStats, Unit};
    use crate::model::{Encoded, Model, ModelError};
    use crate::session::{pass_channel, PassTicket, StreamSession};
    use crate::tower_error::InputError;
    use crate::{Device, TowerError, TowerOptions};

    /// A session that records the calls the device's thread makes and hands back zero rows of
    /// each pass's planned size.
    struct Recorder {
        width: usize,
        /// Rows per image of each pass, in the order the passes are staged.
        passes: VecDeque<Vec<usize>>,
        staged: Option<(usize, Vec<usize>)>,
        launched: VecDeque<(usize, Vec<usize>)>,
        next: usize,
        calls: Vec<String>,
        most_launched: usize,
    }

    impl StreamSession for Recorder {
        fn stage(&mut self, _ticket: PassTicket, _patches: usize) -> Result<(), InputError> {
            let rows = self.passes.pop_front().unwrap_or_default();
            self.calls.push(format!("stage {}", self.next));
            self.staged = Some((self.next, rows));
            self.next += 1;
            Ok(())
        }

        fn launch(&mut self, _patches: usize) -> Result<(), InputError> {
            let (k, rows) = self.staged.take().ok_or_else(crate::session::not_staged)?;
            self.calls.push(format!("launch {k}"));
            self.launched.push_back((k, rows));
            self.most_launched = self.most_launched.max(self.launched.len());
            Ok(())
        }

        fn collect(&mut self) -> Result<Option<Vec<Vec<f32>>>, InputError> {
            Ok(self.launched.pop_front().map(|(k, rows)| {
                self.calls.push(format!("collect {k}"));
                rows.iter().map(|r| vec![0.0; r * self.width]).collect()
            }))
        }
    }

    fn fixture_plans(m: &Model, names: &[&str]) -> Vec<Plan> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/images");
        names
            .iter()
            .map(|n| {
                let bytes = std::fs::read(dir.join(n)).expect("fixture image");
                m.plan(ImageSource::Bytes(&bytes)).expect("plan")
            })
            .collect()
    }

    #[test]
    fn the_device_thread_launches_a_pass_before_it_collects_the_one_before() {
        let m = Model::open_with(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/gemma4"),
            &TowerOptions {
                device: Device::Cpu,
                ..TowerOptions::default()
            },
            PrepSettings::default(),
        )
        .expect("fixture model");
        let plans = fixture_plans(
            &m,
            &[
                "coffee_144x96.jpg",
                "camera_gray_96x96.png",
                "tiny_20x15.png",
            ],
        );
        // passes: images 0-1, then 2 refused, then image 3, then images 4-5
        let passes: Vec<(usize, Vec<Plan>)> = vec![
            (0, plans[..2].to_vec()),
            (3, vec![plans[2].clone()]),
            (4, vec![plans[1].clone(), plans[0].clone()]),
        ];
        let (mut out, _inbox) = pass_channel::<()>();
        let (tx, rx) = sync_channel::<Unit>(8);
        let pass = |(first, plans): &(usize, Vec<Plan>), input| Unit::Pass {
            first: *first,
            plans: plans.clone(),
            patches: 1,
            input,
        };
        tx.send(pass(&passes[0], out.send(()).expect("ticket")))
            .expect("send");
        tx.send(Unit::Failed {
            index: 2,
            error: ModelError::Tower(TowerError::Unsupported("refused".into())),
        })
        .expect("send");
        for p in &passes[1..] {
            tx.send(pass(p, out.send(()).expect("ticket")))
                .expect("send");
        }
        drop(tx);
        let mut session = Recorder {
            width: m.tower().width(),
            passes: passes
                .iter()
                .map(|(_, p)| p.iter().map(|p| p.rows as usize).collect())
                .collect(),
            staged: None,
            launched: VecDeque::new(),
            next: 0,
            calls: Vec::new(),
            most_launched: 0,
        };
        let mut seen: Vec<(usize, Result<Encoded, ModelError>)> = Vec::new();
        let mut stats = StreamStats::default();
        m.consume(rx, &mut session, &mut |i, r| seen.push((i, r)), &mut stats)
            .expect("the stream runs to its end");
        // pass k+1 is launched before pass k is collected, except where a refused image must
        // reach the sink after the pass before it
        assert_eq!(
            session.calls,
            [
                "stage 0",
                "launch 0",
                "collect 0",
                "stage 1",
                "launch 1",
                "stage 2",
                "launch 2",
                "collect 1",
                "collect 2",
            ],
        );
        assert_eq!(session.most_launched, 2);
        assert_eq!(
            seen.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 5]
        );
        assert!(seen.iter().all(|(i, r)| r.is_ok() == (*i != 2)));
        assert_eq!((stats.encoded, stats.failed, stats.passes.len()), (5, 1, 3));
    }
}
