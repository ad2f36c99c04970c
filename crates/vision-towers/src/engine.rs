//! The facade's one engine: a family's tower on the host or behind the CUDA path, written once
//! over the family ([`TowerFamily`]: [`Engine`]) and held by [`crate::Tower`] as one trait object
//! ([`TowerEngine`]). Requests reach it as where their images come from ([`Inputs`]); the engine
//! reads its family's typed images out of them, so no code above it matches on a family.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Mutex, PoisonError};

use gpu_core::{DeviceTower, GraphStats, GraphStatus, HostBatch};
use tower_core::HostTower;
use vision_prep::{Prepared, PreparedVideo};

use crate::cuda_engine::{cuda_session, lock, run_job};
use crate::device_rows::{Dest, DeviceResult, Job};
use crate::families::{Config, Image, TowerFamily};
use crate::inputs::pass_ranges;
use crate::session::{
    not_staged, pass_channel, Inbox, Outbox, PassMaker, PassTicket, StreamSession,
};
use crate::tower_error::{cuda_err, InputError};
use crate::{Family, Precision, ProcessorTensors};

/// Where a request's images come from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Inputs<'a> {
    /// Images prepared by the model's preprocessor (vision-prep).
    Prepared(&'a [Prepared]),
    /// An image processor's tensors, under the upstream names and layouts.
    Tensors(&'a ProcessorTensors),
    /// A prepared video (one pass: glm5_next one image of `t` frame pairs, gemma4 one image per
    /// frame).
    Video(&'a PreparedVideo),
}

/// How a device encode runs: passes of at most `ceiling` patches on a tower of `precision`,
/// rows into one buffer (the library's or the caller's: `dest`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceRun<'a> {
    pub(crate) ceiling: usize,
    pub(crate) precision: Precision,
    pub(crate) dest: Dest<'a>,
}

/// A tower of any family, on the host or on a CUDA device: what [`crate::Tower`] holds.
pub(crate) trait TowerEngine: Send + Sync + fmt::Debug {
    /// The family of the tower.
    fn family(&self) -> Family;
    /// The LM width of its rows.
    fn width(&self) -> usize;
    /// Turns the CUDA path's graphs on or off (the host path has none).
    fn set_graphs(&mut self, on: bool);
    /// Graph status (waits for a pass in progress); `None` on the host.
    fn graph_status(&self) -> Option<GraphStatus>;
    /// Graph statistics (waits for a pass in progress); `None` on the host.
    fn graph_stats(&self) -> Option<GraphStats>;
    /// Patches (tower tokens before any merge or pooling) of each image.
    fn patches(&self, inputs: Inputs<'_>) -> Result<Vec<usize>, InputError>;
    /// Every image's rows, in request order, run in passes of at most `ceiling` patches.
    fn run(&self, inputs: Inputs<'_>, ceiling: usize) -> Result<Vec<Vec<f32>>, InputError>;
    /// Every image's rows into one device buffer, as `run` says.
    fn run_device(
        &self,
        inputs: Inputs<'_>,
        run: DeviceRun<'_>,
    ) -> Result<DeviceResult, InputError>;
    /// The two ends of a stream of passes (see `session.rs`): the maker of pass inputs, for the
    /// producer's thread, and the session that stages, launches and collects them, for the
    /// thread that holds the tower (on CUDA its lock, until the session drops). `ceiling`: the
    /// host path's pass ceiling.
    fn stream(
        &self,
        precision: Precision,
        ceiling: usize,
    ) -> (Box<dyn PassMaker + '_>, Box<dyn StreamSession + '_>);
}

/// Where a family's tower runs.
pub(crate) enum Place<F: TowerFamily> {
    /// The host f32 reference.
    Host(F::Host),
    /// The CUDA tower, behind a mutex: its runs need `&mut`; passes from several threads take
    /// turns.
    Cuda(Mutex<F::Cuda>),
}

/// A family's tower where it runs, with its config on the host.
pub(crate) struct Engine<F: TowerFamily> {
    pub(crate) config: Config<F>,
    pub(crate) place: Place<F>,
}

impl<F: TowerFamily> fmt::Debug for Engine<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = match &self.place {
            Place::Host(t) => format!("Host({t:?})"),
            Place::Cuda(c) => format!("Cuda({c:?})"),
        };
        f.debug_struct("Engine")
            .field("config", &self.config)
            .field("place", &place)
            .finish()
    }
}

impl<F: TowerFamily> Engine<F> {
    /// The engine of a host tower.
    pub(crate) fn host(tower: F::Host) -> Engine<F> {
        Engine {
            config: F::host_config(&tower).clone(),
            place: Place::Host(tower),
        }
    }

    /// The engine of a CUDA tower.
    pub(crate) fn cuda(tower: F::Cuda) -> Engine<F> {
        Engine {
            config: tower.config().clone(),
            place: Place::Cuda(Mutex::new(tower)),
        }
    }

    /// Hands `f` the family's images of `inputs` (borrowed from them).
    pub(crate) fn with_images<R>(
        &self,
        inputs: Inputs<'_>,
        f: impl FnOnce(&[Image<'_, F>]) -> Result<R, InputError>,
    ) -> Result<R, InputError> {
        match inputs {
            Inputs::Prepared(prepared) => {
                let images = prepared
                    .iter()
                    .map(|p| {
                        F::from_prepared(p).ok_or_else(|| {
                            InputError::Message(format!(
                                "a prepared image lacks the {} tensors",
                                F::INPUTS
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                f(&images)
            }
            Inputs::Tensors(set) => F::with_tensors(&self.config, set, f),
            Inputs::Video(video) => match F::from_video(video) {
                Some(images) => f(&images),
                None => Err(InputError::Unsupported(
                    "the prepared video lacks its tower tensors".into(),
                )),
            },
        }
    }

    fn patches_of(&self, images: &[Image<'_, F>]) -> Vec<usize> {
        images.iter().map(|i| F::patches(&self.config, i)).collect()
    }

    /// One pass over `images` (`patches` in all): rows per image.
    fn pass(&self, images: &[Image<'_, F>], patches: usize) -> Result<Vec<Vec<f32>>, InputError> {
        match &self.place {
            Place::Host(t) => t.encode_rows(images).map_err(InputError::family),
            Place::Cuda(c) => {
                let mut c = lock(c);
                let run = |c: &mut F::Cuda| {
                    let batch = c.prepare(images)?;
                    c.run_pass(&batch)?;
                    c.pass_rows(&batch)
                };
                run(&mut c).map_err(|e| cuda_err(e, patches))
            }
        }
    }

    /// [`TowerEngine::run`] over the family's images.
    pub(crate) fn run_images(
        &self,
        images: &[Image<'_, F>],
        ceiling: usize,
    ) -> Result<Vec<Vec<f32>>, InputError> {
        let patches = self.patches_of(images);
        let passes = pass_ranges(&patches, ceiling)?;
        let split = passes.len() > 1;
        let mut per_image = Vec::with_capacity(patches.len());
        for range in passes {
            let n = patches[range.clone()]
                .iter()
                .fold(0usize, |a, &p| a.saturating_add(p));
            let rows = self.pass(&images[range.clone()], n).map_err(|e| {
                if split {
                    InputError::Pass {
                        first: range.start,
                        last: range.end.saturating_sub(1),
                        source: Box::new(e),
                    }
                } else {
                    e
                }
            })?;
            per_image.extend(rows);
        }
        Ok(per_image)
    }
}

impl<F: TowerFamily> TowerEngine for Engine<F> {
    fn family(&self) -> Family {
        F::family(&self.config)
    }

    fn width(&self) -> usize {
        F::width(&self.config)
    }

    fn set_graphs(&mut self, on: bool) {
        if let Place::Cuda(c) = &mut self.place {
            c.get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .set_graphs(on);
        }
    }

    fn graph_status(&self) -> Option<GraphStatus> {
        match &self.place {
            Place::Cuda(c) => Some(lock(c).graph_status().clone()),
            Place::Host(_) => None,
        }
    }

    fn graph_stats(&self) -> Option<GraphStats> {
        match &self.place {
            Place::Cuda(c) => Some(lock(c).graph_stats()),
            Place::Host(_) => None,
        }
    }

    fn patches(&self, inputs: Inputs<'_>) -> Result<Vec<usize>, InputError> {
        self.with_images(inputs, |images| Ok(self.patches_of(images)))
    }

    fn run(&self, inputs: Inputs<'_>, ceiling: usize) -> Result<Vec<Vec<f32>>, InputError> {
        self.with_images(inputs, |images| self.run_images(images, ceiling))
    }

    fn run_device(
        &self,
        inputs: Inputs<'_>,
        run: DeviceRun<'_>,
    ) -> Result<DeviceResult, InputError> {
        let DeviceRun {
            ceiling,
            precision,
            dest,
        } = run;
        self.with_images(inputs, |images| {
            let patches = self.patches_of(images);
            let passes = pass_ranges(&patches, ceiling)?;
            let want = match dest {
                Dest::Owned(d) => d,
                Dest::Caller(out) => out.dtype,
            };
            if let Some(why) = crate::rows_dtype_refusal(precision, want) {
                return Err(InputError::Message(why));
            }
            let job = Job {
                passes: &passes,
                patches: &patches,
                precision,
                dest,
            };
            match &self.place {
                Place::Cuda(c) => run_job::<F::Cuda>(&job, c, &self.config, images),
                Place::Host(_) => Err(InputError::Message(format!(
                    "rows on a GPU need a model opened on CUDA; this one runs on {} (its rows \
                     come back to the host as float32)",
                    crate::Device::Cpu
                ))),
            }
        })
    }

    fn stream(
        &self,
        precision: Precision,
        ceiling: usize,
    ) -> (Box<dyn PassMaker + '_>, Box<dyn StreamSession + '_>) {
        match &self.place {
            Place::Host(_) => host_stream(self, ceiling),
            Place::Cuda(c) => {
                let (out, inbox) = pass_channel();
                let maker = CudaMaker {
                    engine: self,
                    precision,
                    out,
                };
                (Box::new(maker), cuda_session(lock(c), inbox))
            }
        }
    }
}

/// The host path's maker: the pass input is its prepared images.
struct HostMaker {
    out: Outbox<Vec<Prepared>>,
}

impl PassMaker for HostMaker {
    fn make(&mut self, prepared: Vec<Prepared>) -> Result<(PassTicket, Vec<Prepared>), InputError> {
        Ok((self.out.send(prepared)?, Vec::new()))
    }
}

/// The host path's session: a pass is computed at launch; its rows wait for their collect.
struct HostSession<'a> {
    engine: &'a dyn TowerEngine,
    ceiling: usize,
    inbox: Inbox<Vec<Prepared>>,
    staged: Option<Vec<Prepared>>,
    /// The rows of the passes launched and not collected, oldest first.
    done: VecDeque<Vec<Vec<f32>>>,
}

impl StreamSession for HostSession<'_> {
    fn stage(&mut self, ticket: PassTicket, _patches: usize) -> Result<(), InputError> {
        self.staged = Some(self.inbox.take(ticket)?);
        Ok(())
    }

    fn launch(&mut self, _patches: usize) -> Result<(), InputError> {
        let prepared = self.staged.take().ok_or_else(not_staged)?;
        let rows = self.engine.run(Inputs::Prepared(&prepared), self.ceiling)?;
        self.done.push_back(rows);
        Ok(())
    }

    fn collect(&mut self) -> Result<Option<Vec<Vec<f32>>>, InputError> {
        Ok(self.done.pop_front())
    }
}

/// The ends of a stream on the host path of `engine` (passes of at most `ceiling` patches).
fn host_stream(
    engine: &dyn TowerEngine,
    ceiling: usize,
) -> (Box<dyn PassMaker + '_>, Box<dyn StreamSession + '_>) {
    let (out, inbox) = pass_channel();
    (
        Box::new(HostMaker { out }),
        Box::new(HostSession {
            engine,
            ceiling,
            inbox,
            staged: None,
            done: VecDeque::new(),
        }),
    )
}

/// A family's pass inputs as its CUDA tower's host half makes them.
type HostPass<F> = HostBatch<<<F as TowerFamily>::Cuda as DeviceTower>::Meta>;

/// The CUDA path's maker: the host half of each pass (validation, patch rows in the GEMM
/// precision), off the device's thread.
struct CudaMaker<'a, F: TowerFamily> {
    engine: &'a Engine<F>,
    precision: Precision,
    out: Outbox<HostPass<F>>,
}

impl<F: TowerFamily> PassMaker for CudaMaker<'_, F> {
    fn make(&mut self, prepared: Vec<Prepared>) -> Result<(PassTicket, Vec<Prepared>), InputError> {
        let (config, precision) = (&self.engine.config, self.precision);
        let batch = self
            .engine
            .with_images(Inputs::Prepared(&prepared), |images| {
                let n = images
                    .iter()
                    .fold(0usize, |a, i| a.saturating_add(F::patches(config, i)));
                F::Cuda::prepare_host(config, precision, images).map_err(|e| cuda_err(e, n))
            })?;
        Ok((self.out.send(batch)?, prepared))
    }
}
