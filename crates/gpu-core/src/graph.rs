//! CUDA graphs: the device work one forward queues on a [`Device`]'s stream, captured once per
//! batch layout and replayed when that layout comes again, so its launch overhead vanishes.
//!
//! - [`Device::capture`] records what a closure queues (kernel launches, cuBLASLt GEMMs on the
//!   preallocated workspace, device-to-device copies) into a [`Graph`]; [`Graph::launch`] replays
//!   it. Inside the closure nothing may allocate, synchronise, copy to or from the host or query
//!   anything that launches work: such a call fails the capture, and the capture's error says so.
//! - [`GraphCache`] is the bounded, host-side bookkeeping (least recently used first out), and
//!   [`Graphs`] the policy a tower follows: a layout seen for the first time runs eagerly (which
//!   also warms the GEMM plans and the workspace), the second time it is captured and launched,
//!   from then on replayed. A capture that fails turns graphs off for that tower, once, with the
//!   reason kept in [`GraphStatus::Failed`]; the forward then runs eagerly.
//!
//! A graph holds the device addresses it was captured with: the tower keeps its inputs in fixed
//! buffers it copies each batch into before the launch, and [`Graphs::invalidate`]s the cache
//! whenever those buffers or the workspace are reallocated.
use std::fmt;

use cudarc::driver::{sys, CudaGraph};

use crate::{Device, GpuError, Precision, Result};

/// A captured, instantiated sequence of device work on a [`Device`]'s stream.
pub struct Graph {
    inner: CudaGraph,
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph").finish_non_exhaustive()
    }
}

// SAFETY: CUDA graph objects may be used from any thread as long as calls on one object are
// serialised (CUDA driver API, "Graph object thread safety"). The only call after creation is
// `launch`, which takes `&mut self`, and `Drop`, which owns it: both are serialised by Rust.
unsafe impl Send for Graph {}
// SAFETY: no method takes `&self` and touches the graph (see `Send` above).
unsafe impl Sync for Graph {}

impl Graph {
    /// Queues the whole captured sequence on the stream it was captured on.
    pub fn launch(&mut self) -> Result<()> {
        self.inner.launch()?;
        Ok(())
    }
}

impl Device {
    /// Captures the work `f` queues on this device's stream into a [`Graph`] without running it.
    /// `f` may only queue work (see the module docs). When `f` fails, or the driver refuses the
    /// capture, the capture is ended and the error returned; nothing was run either way.
    pub fn capture<E: From<GpuError>>(
        &self,
        f: impl FnOnce(&Device) -> std::result::Result<(), E>,
    ) -> std::result::Result<Graph, E> {
        use sys::CUstreamCaptureStatus as S;
        if self.stream.capture_status().map_err(GpuError::from)? != S::CU_STREAM_CAPTURE_STATUS_NONE
        {
            return Err(GpuError::Capture("the stream is already capturing".into()).into());
        }
        // Thread-local mode: only calls from this thread can invalidate the capture, so another
        // thread preparing the next batch (host work) is never in its way.
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(GpuError::from)?;
        let queued = f(self);
        // Always end the capture, so the stream runs work again whatever happened inside.
        let ended = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        // An error a destructor recorded inside the capture (cudarc keeps it for the next call)
        // belongs to this capture: take it now, so the eager run after a failure starts clean.
        let stale = self.ctx.check_err();
        queued?;
        match (ended, stale) {
            (Ok(Some(inner)), Ok(())) => Ok(Graph { inner }),
            (Ok(Some(_)), Err(e)) => {
                Err(GpuError::Capture(format!("an error was recorded during capture: {e}")).into())
            }
            (Ok(None), _) => Err(GpuError::Capture("nothing was queued".into()).into()),
            (Err(e), _) => Err(GpuError::Capture(format!("ending the capture: {e}")).into()),
        }
    }
}

/// What identifies one captured forward: the tower's precision and the exact layout of its batch
/// (segment bounds, grids, views: whatever decides the launches and their arguments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphKey {
    /// The tower's GEMM precision.
    pub precision: Precision,
    /// The batch layout, as the tower spells it.
    pub layout: Vec<usize>,
}

/// A bounded cache of captured graphs, least recently used first out, plus the layouts seen once
/// (run eagerly, not captured yet). Host-side bookkeeping only: `V` is a [`Graph`] in the towers.
#[derive(Debug)]
pub struct GraphCache<K, V> {
    capacity: usize,
    /// Least recently used first.
    entries: Vec<(K, V)>,
    /// Oldest first, at most [`SEEN_PER_GRAPH`] × capacity.
    seen: Vec<K>,
}

/// How many layouts seen once the cache remembers per graph it can hold.
pub const SEEN_PER_GRAPH: usize = 4;

impl<K: PartialEq, V> GraphCache<K, V> {
    /// A cache holding at most `capacity` graphs (0: never captures).
    pub fn new(capacity: usize) -> Self {
        GraphCache {
            capacity,
            entries: Vec::new(),
            seen: Vec::new(),
        }
    }

    /// The most graphs it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Graphs held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no graph.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a graph for `key` is held (does not touch the recency order).
    pub fn contains(&self, key: &K) -> bool {
        self.entries.iter().any(|(k, _)| k == key)
    }

    /// The graph for `key`, now the most recently used.
    pub fn lookup(&mut self, key: &K) -> Option<&mut V> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        let e = self.entries.remove(i);
        self.entries.push(e);
        self.entries.last_mut().map(|(_, v)| v)
    }

    /// Records a run of `key` without a graph: true when it was seen before (capture it now; it
    /// leaves the seen list), false the first time (it joins the list, the oldest falls out).
    pub fn note(&mut self, key: K) -> bool {
        if let Some(i) = self.seen.iter().position(|k| *k == key) {
            self.seen.remove(i);
            return true;
        }
        let bound = SEEN_PER_GRAPH * self.capacity;
        if bound > 0 {
            if self.seen.len() >= bound {
                self.seen.remove(0);
            }
            self.seen.push(key);
        }
        false
    }

    /// Stores the graph of `key` as the most recently used; returns the least recently used one
    /// when that made room. With capacity 0 the graph itself comes back.
    pub fn insert(&mut self, key: K, value: V) -> Option<(K, V)> {
        if let Some(i) = self.entries.iter().position(|(k, _)| *k == key) {
            self.entries.remove(i);
        }
        if self.capacity == 0 {
            return Some((key, value));
        }
        let evicted = (self.entries.len() >= self.capacity).then(|| self.entries.remove(0));
        self.entries.push((key, value));
        evicted
    }

    /// Drops every graph and every layout seen (after the buffers they address were reallocated).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.seen.clear();
    }
}

/// Whether a tower uses graphs, as the caller set it and as capture went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GraphStatus {
    /// Repeated layouts are captured and replayed.
    Enabled,
    /// Turned off by the caller: every forward runs eagerly.
    Disabled,
    /// A capture failed (the first error is kept); every forward since runs eagerly.
    Failed {
        /// What the capture or the first launch of the captured graph said.
        reason: String,
    },
}

/// Counts of what [`Graphs::run`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Graphs captured.
    pub captures: u64,
    /// Forwards replayed from a cached graph.
    pub replays: u64,
    /// Forwards run eagerly (first sight of a layout, graphs off or failed).
    pub eager: u64,
    /// Graphs dropped to make room.
    pub evictions: u64,
    /// Times the cache was cleared because the buffers it addresses were reallocated.
    pub invalidations: u64,
}

/// How one forward ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ran {
    /// Eagerly, kernel by kernel.
    Eager,
    /// Captured just now, then launched.
    Captured,
    /// Replayed from the cache.
    Replayed,
}

/// Something that records queued device work into a replayable graph ([`Device`]; a fake in the
/// host tests).
pub trait Capture {
    /// What a capture gives.
    type Graph: Replay;
    /// Records the work `f` queues, without running it.
    fn capture_with<E: From<GpuError>>(
        &self,
        f: &mut dyn FnMut() -> std::result::Result<(), E>,
    ) -> std::result::Result<Self::Graph, E>;
}

/// A captured graph that can be queued again.
pub trait Replay {
    /// Queues the captured work.
    fn replay(&mut self) -> Result<()>;
}

impl Capture for Device {
    type Graph = Graph;
    fn capture_with<E: From<GpuError>>(
        &self,
        f: &mut dyn FnMut() -> std::result::Result<(), E>,
    ) -> std::result::Result<Graph, E> {
        self.capture(|_| f())
    }
}

impl Replay for Graph {
    fn replay(&mut self) -> Result<()> {
        self.launch()
    }
}

/// Default number of layouts a tower keeps graphs for (a stream of a few image sizes cycles
/// through more than four pass layouts; an LRU smaller than the cycle would capture every time).
pub const DEFAULT_GRAPHS_PER_TOWER: usize = 8;

/// A tower's graphs: the cache, the status and the counts, and the policy of [`Graphs::run`].
#[derive(Debug)]
pub struct Graphs<G = Graph> {
    cache: GraphCache<GraphKey, G>,
    status: GraphStatus,
    stats: GraphStats,
}

impl<G> Default for Graphs<G> {
    fn default() -> Self {
        Graphs::new(DEFAULT_GRAPHS_PER_TOWER)
    }
}

impl<G> Graphs<G> {
    /// Enabled, holding at most `capacity` graphs.
    pub fn new(capacity: usize) -> Self {
        Graphs {
            cache: GraphCache::new(capacity),
            status: GraphStatus::Enabled,
            stats: GraphStats::default(),
        }
    }

    /// Whether graphs are used and, if a capture failed, why not.
    pub fn status(&self) -> &GraphStatus {
        &self.status
    }

    /// What [`Graphs::run`] did so far.
    pub fn stats(&self) -> GraphStats {
        self.stats
    }

    /// Graphs held now.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Turns graphs on (also after a failed capture: the caller retries) or off (drops them).
    pub fn set_enabled(&mut self, on: bool) {
        if on {
            self.status = GraphStatus::Enabled;
        } else {
            self.status = GraphStatus::Disabled;
            self.cache.clear();
        }
    }

    /// Drops every graph: the buffers they address were reallocated.
    pub fn invalidate(&mut self) {
        if !self.cache.is_empty() {
            self.stats.invalidations += 1;
        }
        self.cache.clear();
    }

    /// Runs one forward of layout `key`: replays its graph, captures one the second time the
    /// layout is seen, else runs `forward` eagerly. A capture (or the first launch of a fresh
    /// graph) that fails sets [`GraphStatus::Failed`] and runs `forward` eagerly instead; a
    /// cached graph whose launch fails is an error. `forward` must only queue work and give the
    /// same result however often it runs (it reads the tower's fixed input buffers).
    pub fn run<C, E>(
        &mut self,
        cap: &C,
        key: &GraphKey,
        mut forward: impl FnMut() -> std::result::Result<(), E>,
    ) -> std::result::Result<Ran, E>
    where
        C: Capture<Graph = G>,
        G: Replay,
        E: From<GpuError> + fmt::Display,
    {
        if self.status != GraphStatus::Enabled {
            forward()?;
            self.stats.eager += 1;
            return Ok(Ran::Eager);
        }
        if let Some(g) = self.cache.lookup(key) {
            g.replay()?;
            self.stats.replays += 1;
            return Ok(Ran::Replayed);
        }
        if !self.cache.note(key.clone()) {
            forward()?;
            self.stats.eager += 1;
            return Ok(Ran::Eager);
        }
        let captured = cap
            .capture_with(&mut forward)
            .and_then(|mut g| g.replay().map(|()| g).map_err(E::from));
        match captured {
            Ok(g) => {
                self.stats.captures += 1;
                if self.cache.insert(key.clone(), g).is_some() {
                    self.stats.evictions += 1;
                }
                Ok(Ran::Captured)
            }
            Err(e) => {
                self.status = GraphStatus::Failed {
                    reason: e.to_string(),
                };
                self.cache.clear();
                forward()?;
                self.stats.eager += 1;
                Ok(Ran::Eager)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    fn key(l: &[usize]) -> GraphKey {
        GraphKey {
            precision: Precision::Bf16,
            layout: l.to_vec(),
        }
    }

    #[test]
    fn the_cache_evicts_the_least_recently_used() {
        let mut c: GraphCache<u32, &str> = GraphCache::new(2);
        assert_eq!(c.insert(1, "a"), None);
        assert_eq!(c.insert(2, "b"), None);
        assert_eq!(c.lookup(&1).map(|v| *v), Some("a")); // 1 is now the most recent
        assert_eq!(c.insert(3, "c"), Some((2, "b")));
        assert!(c.contains(&1) && c.contains(&3) && !c.contains(&2));
        assert_eq!(c.insert(3, "c2"), None, "re-inserting a key replaces it");
        assert_eq!(c.len(), 2);
        assert_eq!(c.lookup(&3).map(|v| *v), Some("c2"));
        c.clear();
        assert!(c.is_empty() && c.lookup(&1).is_none());
    }

    #[test]
    fn a_layout_is_noted_once_then_captured() {
        let mut c: GraphCache<u32, ()> = GraphCache::new(1);
        assert!(!c.note(7), "first sight");
        assert!(c.note(7), "second sight: capture");
        assert!(!c.note(7), "it left the seen list");
        // The seen list is bounded: SEEN_PER_GRAPH × capacity, oldest out first.
        for k in 0..SEEN_PER_GRAPH as u32 + 1 {
            assert!(!c.note(100 + k));
        }
        assert!(!c.note(100), "the oldest fell out");
        assert!(c.note(100 + SEEN_PER_GRAPH as u32));
        c.clear();
        assert!(
            !c.note(100 + SEEN_PER_GRAPH as u32),
            "clear forgets what was seen"
        );
    }

    #[test]
    fn a_cache_of_capacity_zero_never_holds_or_remembers() {
        let mut c: GraphCache<u32, &str> = GraphCache::new(0);
        assert!(!c.note(1) && !c.note(1));
        assert_eq!(c.insert(1, "a"), Some((1, "a")));
        assert!(c.is_empty());
    }

    /// A capture that records how often it ran and can be told to fail.
    struct Fake {
        fail: Cell<bool>,
        captured: Cell<u32>,
    }
    struct FakeGraph;
    impl Replay for FakeGraph {
        fn replay(&mut self) -> Result<()> {
            Ok(())
        }
    }
    impl Capture for Fake {
        type Graph = FakeGraph;
        fn capture_with<E: From<GpuError>>(
            &self,
            f: &mut dyn FnMut() -> std::result::Result<(), E>,
        ) -> std::result::Result<FakeGraph, E> {
            if self.fail.get() {
                return Err(GpuError::Capture("driver said no".into()).into());
            }
            f()?; // recording queues the work once, as the device does
            self.captured.set(self.captured.get() + 1);
            Ok(FakeGraph)
        }
    }

    #[test]
    fn eager_then_capture_then_replay_per_layout() {
        let fake = Fake {
            fail: Cell::new(false),
            captured: Cell::new(0),
        };
        let runs = RefCell::new(0u32);
        let mut g: Graphs<FakeGraph> = Graphs::new(2);
        let go = |g: &mut Graphs<FakeGraph>, k: &GraphKey| {
            g.run(&fake, k, || -> Result<()> {
                *runs.borrow_mut() += 1;
                Ok(())
            })
            .unwrap()
        };
        let (a, b) = (key(&[1, 2]), key(&[3]));
        assert_eq!(go(&mut g, &a), Ran::Eager);
        assert_eq!(go(&mut g, &a), Ran::Captured);
        assert_eq!(go(&mut g, &a), Ran::Replayed);
        assert_eq!(
            go(&mut g, &b),
            Ran::Eager,
            "a changed layout is not replayed"
        );
        assert_eq!(
            go(&mut g, &b),
            Ran::Captured,
            "and is captured on its second sight"
        );
        assert_eq!(
            go(&mut g, &a),
            Ran::Replayed,
            "the first layout is still cached"
        );
        // forward ran: a eager, a recorded, b eager, b recorded
        assert_eq!(*runs.borrow(), 4);
        assert_eq!(fake.captured.get(), 2);
        let s = g.stats();
        assert_eq!((s.eager, s.captures, s.replays), (2, 2, 2));
        assert_eq!(*g.status(), GraphStatus::Enabled);
        g.invalidate();
        assert_eq!(g.cached(), 0);
        assert_eq!(g.stats().invalidations, 1);
        assert_eq!(
            go(&mut g, &a),
            Ran::Eager,
            "after invalidation the layout is new again"
        );
    }

    #[test]
    fn a_failed_capture_falls_back_once_and_says_why() {
        let fake = Fake {
            fail: Cell::new(true),
            captured: Cell::new(0),
        };
        let runs = Cell::new(0u32);
        let mut g: Graphs<FakeGraph> = Graphs::default();
        let k = key(&[5]);
        let go = |g: &mut Graphs<FakeGraph>| {
            g.run(&fake, &k, || -> Result<()> {
                runs.set(runs.get() + 1);
                Ok(())
            })
        };
        assert_eq!(go(&mut g).unwrap(), Ran::Eager);
        assert_eq!(
            go(&mut g).unwrap(),
            Ran::Eager,
            "the capture failed: eager instead"
        );
        assert_eq!(runs.get(), 2, "the forward still ran once per call");
        match g.status() {
            GraphStatus::Failed { reason } => {
                assert!(reason.contains("driver said no"), "{reason}")
            }
            s => panic!("status {s:?}"),
        }
        fake.fail.set(false);
        assert_eq!(go(&mut g).unwrap(), Ran::Eager, "no retry once failed");
        assert_eq!(fake.captured.get(), 0);
        g.set_enabled(true);
        assert_eq!(go(&mut g).unwrap(), Ran::Eager);
        assert_eq!(
            go(&mut g).unwrap(),
            Ran::Captured,
            "re-enabled by the caller"
        );
    }

    #[test]
    fn a_forward_error_is_returned_not_swallowed() {
        let fake = Fake {
            fail: Cell::new(false),
            captured: Cell::new(0),
        };
        let mut g: Graphs<FakeGraph> = Graphs::default();
        let k = key(&[9]);
        let bad = || -> Result<()> {
            Err(GpuError::Shape {
                op: "x",
                what: "y".into(),
            })
        };
        assert!(matches!(g.run(&fake, &k, bad), Err(GpuError::Shape { .. })));
        g.set_enabled(false);
        assert_eq!(*g.status(), GraphStatus::Disabled);
        assert!(matches!(g.run(&fake, &k, bad), Err(GpuError::Shape { .. })));
        let ok = || -> Result<()> { Ok(()) };
        assert_eq!(g.run(&fake, &k, ok).unwrap(), Ran::Eager);
        assert_eq!(
            g.run(&fake, &k, ok).unwrap(),
            Ran::Eager,
            "off: never captures"
        );
    }
}
