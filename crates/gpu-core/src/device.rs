//! The CUDA device: context, the compute stream, loaded kernels, cuBLASLt; device buffers.
use std::sync::Arc;

use cudarc::driver::{
    sys::{cudaError_enum, CUfunction_attribute},
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig,
};
use half::{bf16, f16};

use crate::kernels::{module_images, Kernel, Module, ModuleImage, ModuleSource};
use crate::{GpuError, Precision, Result};

/// Element types a [`DeviceBuffer`] holds. Sealed: f32, bf16, f16, i32.
pub trait Elem: DeviceRepr + Copy + Default + Send + Sync + 'static + sealed::Sealed {
    /// The type's name, for error messages.
    const NAME: &'static str;
}
mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for i32 {}
}
impl Elem for f32 {
    const NAME: &'static str = "f32";
}
impl Elem for bf16 {
    const NAME: &'static str = "bf16";
}
impl Elem for f16 {
    const NAME: &'static str = "f16";
}
impl Elem for i32 {
    const NAME: &'static str = "i32";
}

/// A dense device array of `len` elements of `T`, freed on drop (stream-ordered).
#[derive(Debug)]
pub struct DeviceBuffer<T: Elem> {
    pub(crate) slice: CudaSlice<T>,
}

impl<T: Elem> DeviceBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.slice.len()
    }
    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }
    /// Raw device address (u64) for kernel arguments.
    pub(crate) fn addr(&self) -> u64 {
        // Event tracking is disabled on our context (`Device::new`: cross-stream uses are ordered
        // by hand), so the guard records nothing.
        let (p, _guard) = self.slice.device_ptr(self.slice.stream());
        p
    }
}

/// Address of an optional buffer, 0 for none (kernels treat a null pointer as "absent").
pub(crate) fn opt_addr<T: Elem>(b: Option<&DeviceBuffer<T>>) -> u64 {
    b.map_or(0, |b| b.addr())
}

/// How [`Device::with_options`] opens a device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Run an older tier of the table on this card (its compute capability, e.g. `(8, 0)`; names
    /// parse with [`crate::tier::parse_tier`]): its code (an older tier's PTX through the driver's
    /// JIT), its limits and its kernels — a test of code paths and limits, not of that card's speed.
    /// `None` reads `GPU_CORE_FORCE_TIER` ([`crate::tier::FORCE_TIER_ENV`]); unset or empty there,
    /// the card's own tier.
    pub force_tier: Option<(u32, u32)>,
    /// Start every buffer [`Device::alloc`] hands out as 0xff bytes (NaN), a diagnostic for the
    /// sanitizer runs ([`POISON_ALLOC_ENV`]). `false` reads `GPU_CORE_POISON_ALLOC`.
    pub poison_alloc: bool,
}

impl DeviceOptions {
    /// The tier to force: the option, else the environment variable's (empty = none; a name that is
    /// not a tier is an error, never ignored).
    fn forced_tier(&self) -> Result<Option<(u32, u32)>> {
        if let Some(cc) = self.force_tier {
            return Ok(Some(cc));
        }
        match std::env::var(crate::tier::FORCE_TIER_ENV) {
            Ok(name) if !name.trim().is_empty() => Ok(Some(crate::tier::parse_tier(&name)?)),
            _ => Ok(None),
        }
    }

    /// Whether new buffers start as 0xff bytes: the option, else the environment variable's
    /// ([`POISON_ALLOC_ENV`], `1` only).
    fn poisons(&self) -> bool {
        self.poison_alloc || poison_alloc_from(std::env::var_os(POISON_ALLOC_ENV).as_deref())
    }
}

/// One CUDA device with a stream, the PTX kernels loaded and a cuBLASLt handle.
///
/// **API Boundary:** raw pointers, launches and cuBLASLt descriptors stay inside this crate; every
/// public operation checks its shapes against the buffers before it launches anything.
pub struct Device {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// Where rows handed to callers are allocated and freed ([`crate::OwnedRows`]): never the
    /// compute stream, which may be capturing a graph when a caller drops its rows.
    pub(crate) release: Arc<CudaStream>,
    /// Indexed like [`Kernel::ALL`]; `None` for kernels of a module this device cannot load (sm_90a).
    funcs: Vec<Option<CudaFunction>>,
    /// Where each loaded module's code came from.
    sources: Vec<(Module, ModuleSource)>,
    pub(crate) lt: crate::gemm::lt_cache::Lt,
    /// Shared memory a block may use: the tier's limit (never more than the card's opt-in maximum),
    /// set on the large kernels.
    pub(crate) smem_optin: usize,
    /// The tier whose code, limits and kernels this device runs.
    tier: crate::tier::Tier,
    /// Streaming multiprocessors, read once (the attention launcher's wave model asks per launch).
    pub(crate) sms: usize,
    /// Per-operation events while a profile is recorded ([`Device::profile_begin`]).
    pub(crate) prof: crate::profile::Recorder,
    /// Fill every new buffer with 0xff bytes ([`POISON_ALLOC_ENV`]).
    pub(crate) poison_alloc: bool,
}

/// The environment variable that makes every buffer [`Device::alloc`] hands out start as 0xff
/// bytes (NaN in f32, bf16 and f16; -1 in i32) instead of unspecified contents, as glibc's
/// `MALLOC_PERTURB_` does for `malloc`. A diagnostic for the sanitizer runs
/// (`kernels/sanitize_device.sh`): a kernel that reads an element nothing wrote then puts NaN in
/// the rows, which the tests refuse, and compute-sanitizer's initcheck counts the fill as a write,
/// so what it still reports is a read of memory no command on the stream wrote. Set to `1` to turn
/// it on; read once when a [`Device`] opens. Costs one memset per allocation.
pub const POISON_ALLOC_ENV: &str = "GPU_CORE_POISON_ALLOC";

/// Whether [`POISON_ALLOC_ENV`]'s value turns the fill on: `1` only.
fn poison_alloc_from(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| v == "1")
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ctx.ordinal())
            .finish()
    }
}

/// Whether the CUDA driver and cuBLASLt libraries can be loaded and report at least one device.
/// Never panics.
pub fn is_available() -> bool {
    probe(0).is_ok()
}

/// How many CUDA devices the driver reports, without creating a context. Never panics.
///
/// `Ok(0)` means no CUDA at all here: the driver library (`libcuda.so.1`) is not installed, or
/// the driver says there is no device (`CUDA_ERROR_NO_DEVICE`). An installed driver that fails
/// to start for any other reason is an error ([`GpuError::Driver`], or [`GpuError::Unusable`]
/// when the binding panics): a machine with a GPU and a broken CUDA stack is not a machine
/// without CUDA.
pub fn device_count() -> Result<usize> {
    Ok(match driver()? {
        Driver::Absent(_) => 0,
        Driver::Devices(n) => n,
    })
}

/// What the driver library says, before any context exists.
enum Driver {
    /// No CUDA here (the reason): no driver library, or no device behind it.
    Absent(String),
    /// The driver started and reports this many devices (at least one).
    Devices(usize),
}

fn driver() -> Result<Driver> {
    // SAFETY: is_culib_present only tries to dlopen the candidate library names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Ok(Driver::Absent(
            "the CUDA driver library (libcuda.so.1) is not installed".into(),
        ));
    }
    let count = std::panic::catch_unwind(CudaContext::device_count).map_err(|_| {
        GpuError::Unusable("the CUDA driver panicked while counting devices".into())
    })?;
    match count {
        Err(e) if e.0 == cudaError_enum::CUDA_ERROR_NO_DEVICE => Ok(Driver::Absent(format!(
            "the CUDA driver reports no device ({e})"
        ))),
        Err(e) => Err(GpuError::Driver(e)),
        Ok(n) if n <= 0 => Ok(Driver::Absent("the CUDA driver reports 0 devices".into())),
        Ok(n) => Ok(Driver::Devices(n as usize)),
    }
}

/// [`GpuError::NoDevice`] where this machine has no CUDA (or no device `ordinal`); any other
/// failure of an installed CUDA stack is another error.
fn probe(ordinal: usize) -> Result<()> {
    let count = match driver()? {
        Driver::Absent(why) => return Err(GpuError::NoDevice(why)),
        Driver::Devices(n) => n,
    };
    if ordinal >= count {
        return Err(GpuError::NoDevice(format!(
            "device {ordinal} asked for, {count} present"
        )));
    }
    check_driver()?;
    if let Err(why) = crate::gemm::lt_lib::cublaslt() {
        return Err(GpuError::Unusable(format!(
            "the CUDA driver reports {count} device(s) but {why}"
        )));
    }
    Ok(())
}

/// Test hook: `GPU_CORE_FAKE_DEVICE=<major.minor>` makes [`Device::with_options`] act as if this
/// machine had a CUDA device of that compute capability that cannot run the tower — below 7.5 it
/// is refused by its tier ([`GpuError::Tier`]), otherwise it fails as a device that loads no module
/// ([`GpuError::Unusable`]) — so callers' "device present but unusable" paths (the reason `auto`
/// keeps and reports) are tested on machines without a GPU. Never set in production.
pub const FAKE_DEVICE_ENV: &str = "GPU_CORE_FAKE_DEVICE";

fn fake_device() -> Result<Option<(u32, u32)>> {
    let Ok(v) = std::env::var(FAKE_DEVICE_ENV) else {
        return Ok(None);
    };
    let bad = || {
        GpuError::Unusable(format!(
            "{FAKE_DEVICE_ENV}={v:?} is not a compute capability such as 7.0 or 8.6"
        ))
    };
    let (a, b) = v.trim().split_once('.').ok_or_else(bad)?;
    Ok(Some((
        a.parse().map_err(|_| bad())?,
        b.parse().map_err(|_| bad())?,
    )))
}

/// [`GpuError::Unusable`] naming both versions where the driver is older than CUDA 13.0 needs
/// (cudarc resolves each driver symbol when first called, so this asks before anything newer is).
fn check_driver() -> Result<()> {
    let (status, api) = std::panic::catch_unwind(|| {
        let mut api: std::ffi::c_int = 0;
        // SAFETY: cuDriverGetVersion writes one int through the pointer; the driver library is
        // present (`driver` checked it) and this entry point exists in every driver since CUDA 2.2.
        let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut api) };
        (status, api)
    })
    .map_err(|_| GpuError::Unusable("the CUDA driver panicked reporting its version".into()))?;
    if status != cudaError_enum::CUDA_SUCCESS {
        return Err(GpuError::Unusable(format!(
            "the CUDA driver did not report its version ({status:?})"
        )));
    }
    crate::tier::check_driver_version(api).map_err(GpuError::Unusable)
}

impl Device {
    /// Opens device `ordinal` on its own tier (or the one `GPU_CORE_FORCE_TIER` names): see
    /// [`Device::with_options`].
    pub fn new(ordinal: usize) -> Result<Self> {
        Device::with_options(ordinal, &DeviceOptions::default())
    }

    /// Opens device `ordinal`: a context, a stream, every kernel module and a cuBLASLt handle.
    /// Never panics. Returns [`GpuError::NoDevice`] only where this machine has no CUDA (no
    /// driver library, no device, or fewer devices than `ordinal + 1`); a CUDA stack that is
    /// installed but fails (a context that cannot be created, a PTX module that does not load,
    /// cuBLASLt missing or failing) is another variant, so callers can tell the two apart.
    /// The tier ([`crate::tier`]) comes from the card's compute capability, or from
    /// `options.force_tier`: a card older than 7.5 is [`GpuError::Tier`], as is a forced tier the card
    /// cannot run.
    pub fn with_options(ordinal: usize, options: &DeviceOptions) -> Result<Self> {
        if let Some(fake) = fake_device()? {
            // what a card of this capability would be refused with, else a simulated failure
            crate::tier::Tier::choose(fake, options.forced_tier()?)?;
            return Err(GpuError::Unusable(format!(
                "{FAKE_DEVICE_ENV}={}.{}: a simulated device, which loads no module",
                fake.0, fake.1
            )));
        }
        probe(ordinal)?;
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal)).map_err(|_| {
            GpuError::Unusable(format!(
                "the CUDA driver panicked while creating a context on device {ordinal}"
            ))
        })??;
        // SAFETY: with event tracking off, cudarc no longer orders a buffer's uses across streams
        // by itself, so every buffer used on two streams must be ordered by hand. The streams of
        // this crate: the device's compute stream (created below; every kernel, GEMM, graph and
        // `Stager` copy runs on it, and every `DeviceBuffer` is allocated and freed on it); each
        // `Uploader`'s copy stream (staging.rs), which only ever writes that uploader's own slots;
        // the release stream (below), where rows handed to callers (`OwnedRows`, rows_out.rs) are
        // allocated, read back after `ready` and freed; and callers' streams that consume them. Only the slots and
        // the handed-out rows are touched by two streams, and each is ordered with events:
        // - slots (staging.rs): the copy stream records `uploaded` after a slot's copies and the
        //   compute stream waits on it before reading the slot (`load_inputs`); the compute stream
        //   records `consumed` after its copies out and the copy stream waits on it before
        //   refilling the slot (`stage`); the host waits on `uploaded` before rewriting the slot's
        //   page-locked memory or reallocating the slot, synchronises the compute stream after
        //   allocating slot memory (stream-ordered there) before the copy stream writes it, and
        //   `Uploader::drop` synchronises the copy stream before the slots are freed;
        // - rows (rows_out.rs): the compute stream waits on an event recorded on the release
        //   stream after the allocation before writing them, records `ready` after the last write,
        //   consumer streams wait on `ready`, and the free is queued on the release stream after
        //   `ready` and after an event recorded on every consumer stream at drop (deferred while a
        //   consumer is capturing); a caller's own memory is written after the compute stream
        //   waited on the caller's stream, which then waits on the compute stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let release = ctx.new_stream()?;
        let (major, minor) = ctx.compute_capability()?;
        let card = (major.max(0) as u32, minor.max(0) as u32);
        let tier = crate::tier::Tier::choose(card, options.forced_tier()?)?;
        let code = tier.arch.code;
        // Whether the card runs the SASS of this tier's fatbins (same major, not older), else the
        // driver compiles the fatbin's PTX (a tier forced on a newer card).
        let card_runs_sass = code.has_sass_for(card);
        let mut modules = Vec::new();
        let mut sources = Vec::new();
        for m in Module::ALL {
            if m.needs_sm90a() && tier.arch.kernels != crate::tier::KernelSet::Hopper {
                continue;
            }
            // The first image that loads: the fatbin's SASS where it holds code for this device,
            // else the PTX (JIT); the last failure is the error.
            let mut loaded = None;
            let mut failure = String::new();
            for (source, image) in module_images(m, code)? {
                let image = match image {
                    ModuleImage::Sass(bytes) => cudarc::nvrtc::Ptx::from_binary(bytes.to_vec()),
                    ModuleImage::Ptx(src) => cudarc::nvrtc::Ptx::from_src(src),
                };
                match ctx.load_module(image) {
                    Ok(module) => {
                        loaded = Some((source, module));
                        break;
                    }
                    Err(e) => failure = format!("loading ({source:?}): {e}"),
                }
            }
            let Some((source, module)) = loaded else {
                return Err(GpuError::Ptx {
                    module: m.name(),
                    what: failure,
                });
            };
            let source = match source {
                ModuleSource::Sass if !card_runs_sass => ModuleSource::FatbinPtx,
                s => s,
            };
            sources.push((m, source));
            modules.push((m, module));
        }
        // The most shared memory one block may opt into: the tier's limit (the table's, so a forced
        // tier gets its real card's limit), never above what this card allows. The large kernels'
        // limit, raised at load.
        let card_optin = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?;
        let smem_optin = (tier.arch.smem_per_block as i32).min(card_optin);
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )?
            .max(1) as usize;
        let mut funcs = Vec::with_capacity(Kernel::ALL.len());
        for k in Kernel::ALL {
            let Some((_, module)) = modules.iter().find(|(m, _)| *m == k.module()) else {
                funcs.push(None);
                continue;
            };
            let f = module.load_function(k.name()).map_err(|e| GpuError::Ptx {
                module: k.module().name(),
                what: format!("{}: {e}", k.name()),
            })?;
            if k.module().large_shared_memory() {
                // the opt-in maximum covers static and dynamic shared memory together
                let fixed =
                    f.get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
                f.set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem_optin - fixed,
                )?;
            }
            funcs.push(Some(f));
        }
        let lt = crate::gemm::lt_cache::Lt::new(&stream)?;
        Ok(Device {
            ctx,
            stream,
            release,
            funcs,
            sources,
            smem_optin: smem_optin.max(0) as usize,
            tier,
            sms,
            lt,
            prof: crate::profile::Recorder::default(),
            poison_alloc: options.poisons(),
        })
    }

    /// Where each loaded module's code came from (modules this device cannot load are absent):
    /// [`ModuleSource::Sass`] unless the fatbin holds no code for this device or
    /// `$GPU_CORE_PTX_DIR` is set.
    pub fn module_sources(&self) -> &[(Module, ModuleSource)] {
        &self.sources
    }

    /// The tier this device runs: its table row (code, limits, kernels, precisions) and whether it
    /// was forced.
    pub fn tier(&self) -> &crate::tier::Tier {
        &self.tier
    }

    /// Whether this device's tier computes in bf16 (tensor cores with bf16 inputs: compute
    /// capability 8.0 and newer).
    pub fn supports_bf16(&self) -> bool {
        self.tier.arch.precisions.bf16
    }

    /// Whether this device's tier has the f16 kernels (f16 GEMM inputs and attention on the tensor
    /// cores: every tier of [`crate::tier::ARCHS`], Turing's on its own attention kernels).
    pub fn supports_f16(&self) -> bool {
        self.tier.arch.precisions.f16
    }

    /// Why this device cannot run a tower in `p`, or `None` when it can: its tier's rule
    /// ([`crate::tier::Tier::precision_refusal`]: bf16 needs bf16 tensor cores, 8.0 and newer, and
    /// a tier without them is advised f16). Each tower asks before uploading a weight, so a tier
    /// without them refuses at the upload, not at the first attention launch.
    pub fn precision_refusal(&self, p: Precision) -> Option<String> {
        self.tier.precision_refusal(p)
    }

    /// The precision a tower runs in here when none is asked: bf16 from 8.0, f16 on Turing
    /// ([`crate::tier::Tier::default_precision`]).
    pub fn default_precision(&self) -> Precision {
        self.tier.default_precision()
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> Result<String> {
        Ok(self.ctx.name()?)
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        Ok(self.ctx.compute_capability()?)
    }

    /// Free and total device memory in bytes, as the driver reports them now.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// Number of streaming multiprocessors.
    pub fn multiprocessors(&self) -> Result<usize> {
        Ok(self.sms)
    }

    /// Blocks until all queued work is done; surfaces asynchronous kernel errors.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    /// Allocates `len` elements with unspecified contents (0xff bytes under
    /// [`POISON_ALLOC_ENV`]). A failed allocation is [`GpuError::OutOfMemory`], never an abort.
    pub fn alloc<T: Elem>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(GpuError::OutOfMemory { bytes: usize::MAX })?;
        // SAFETY: T is plain old data (f32, bf16, f16, i32): every bit pattern is a valid value, so reading
        // the uninitialised contents back is not undefined behaviour, only unspecified data.
        let mut slice = unsafe { self.stream.alloc::<T>(len.max(1)) }
            .map_err(|e| GpuError::from_alloc(e, bytes))?;
        if self.poison_alloc {
            let num_bytes = slice.num_bytes();
            let (ptr, _record) = slice.device_ptr_mut(&self.stream);
            // SAFETY: `ptr` holds `num_bytes` bytes of a live allocation, ordered on this stream.
            unsafe {
                cudarc::driver::result::memset_d8_async(
                    ptr,
                    0xff,
                    num_bytes,
                    self.stream.cu_stream(),
                )
            }?;
        }
        Ok(DeviceBuffer { slice })
    }

    /// Allocates `len` zeroed elements.
    pub fn alloc_zeros<T: Elem + cudarc::driver::ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<DeviceBuffer<T>> {
        let mut b = self.alloc(len)?;
        self.stream.memset_zeros(&mut b.slice)?;
        Ok(b)
    }

    /// Copies a host slice to a new device buffer.
    pub fn upload<T: Elem>(&self, host: &[T]) -> Result<DeviceBuffer<T>> {
        let mut b = self.alloc(host.len())?;
        self.upload_into(host, &mut b)?;
        Ok(b)
    }

    /// Copies a host slice into the start of an existing buffer.
    pub fn upload_into<T: Elem>(&self, host: &[T], dst: &mut DeviceBuffer<T>) -> Result<()> {
        if host.len() > dst.len() {
            return Err(GpuError::shape(
                "upload_into",
                format!("{} elements into a buffer of {}", host.len(), dst.len()),
            ));
        }
        if host.is_empty() {
            return Ok(());
        }
        let mut view = dst.slice.slice_mut(0..host.len());
        self.stream.memcpy_htod(host, &mut view)?;
        Ok(())
    }

    /// Fills the whole buffer with `value` (e.g. NaN to poison an output before a test launch).
    pub fn fill<T: Elem>(&self, dst: &mut DeviceBuffer<T>, value: T) -> Result<()> {
        let host = vec![value; dst.len()];
        self.upload_into(&host, dst)
    }

    /// Copies a device buffer back to the host (synchronises).
    pub fn download<T: Elem>(&self, src: &DeviceBuffer<T>) -> Result<Vec<T>> {
        self.download_prefix(src, src.len())
    }

    /// Copies the first `len` elements of a device buffer back to the host (synchronises): the
    /// part a pass wrote into a workspace sized for the largest pass so far.
    pub fn download_prefix<T: Elem>(&self, src: &DeviceBuffer<T>, len: usize) -> Result<Vec<T>> {
        if len > src.len() {
            return Err(GpuError::shape(
                "download",
                format!("{len} elements from a buffer of {}", src.len()),
            ));
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        let v = self.stream.clone_dtoh(&src.slice.slice(0..len))?;
        self.stream.synchronize()?;
        Ok(v)
    }

    /// Device-to-device copy of all of `src` into the start of `dst`.
    pub fn copy<T: Elem>(&self, src: &DeviceBuffer<T>, dst: &mut DeviceBuffer<T>) -> Result<()> {
        if src.len() > dst.len() {
            return Err(GpuError::shape(
                "copy",
                format!("{} elements into a buffer of {}", src.len(), dst.len()),
            ));
        }
        let mut view = dst.slice.slice_mut(0..src.len());
        self.stream.memcpy_dtod(&src.slice, &mut view)?;
        Ok(())
    }

    /// Times `work` with CUDA events: `warmup` untimed runs, then `iters` runs each timed alone.
    /// Returns the per-run times in milliseconds, sorted (take the middle one for the median).
    pub fn time_ms(
        &self,
        warmup: usize,
        iters: usize,
        mut work: impl FnMut() -> Result<()>,
    ) -> Result<Vec<f32>> {
        for _ in 0..warmup {
            work()?;
        }
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(timing)?;
        let stop = self.ctx.new_event(timing)?;
        let mut out = Vec::with_capacity(iters);
        for _ in 0..iters {
            start.record(&self.stream)?;
            work()?;
            stop.record(&self.stream)?;
            stop.synchronize()?;
            out.push(start.elapsed_ms(&stop)?);
        }
        out.sort_by(|a, b| a.total_cmp(b));
        Ok(out)
    }

    /// Whether kernel `k` is loaded (the sm_90a kernels exist only on compute capability 9.0).
    pub fn has_kernel(&self, k: Kernel) -> bool {
        self.func(k).is_some()
    }

    pub(crate) fn func(&self, k: Kernel) -> Option<&CudaFunction> {
        let i = Kernel::ALL.iter().position(|x| *x == k)?;
        self.funcs.get(i)?.as_ref()
    }

    /// Launches `k` with `cfg`; `push` adds the arguments in the kernel's order.
    pub(crate) fn launch<'a>(
        &'a self,
        k: Kernel,
        cfg: LaunchConfig,
        push: impl FnOnce(&mut cudarc::driver::LaunchArgs<'a>),
    ) -> Result<()> {
        let f = self.func(k).ok_or_else(|| GpuError::Ptx {
            module: k.module().name(),
            what: format!("{} is not loaded on this device (needs sm_90a)", k.name()),
        })?;
        let open = self.prof_open(|| {
            let (g, b) = (cfg.grid_dim, cfg.block_dim);
            format!(
                "{} grid {}×{}×{} block {}×{}",
                k.name(),
                g.0,
                g.1,
                g.2,
                b.0,
                b.1
            )
        })?;
        let mut b = self.stream.launch_builder(f);
        push(&mut b);
        // SAFETY: every caller checks the buffer lengths, strides and offsets against the shapes the
        // kernel indexes (documented in kernels/README.md) before launching, in checked arithmetic
        // (`Mat::check_len`, `ops::product`: a sum or product that would wrap is an error), checks
        // that the sizes a kernel takes as `int` fit one (`ops::to_i32`, `check_width`), and pushes
        // the arguments in the kernel's declared order and types.
        unsafe { b.launch(cfg) }.map_err(|source| GpuError::Launch {
            kernel: k.name(),
            source,
        })?;
        self.prof_close(open)
    }
}

/// A 1-D grid-stride launch over `total` items with 256-thread blocks, capped at `sms * 32` blocks.
pub(crate) fn grid_stride(total: usize) -> LaunchConfig {
    let blocks = total.div_ceil(256).clamp(1, 132 * 32);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `GPU_CORE_POISON_ALLOC` turns the fill on with `1` only: unset, empty, `0` or any other
    /// word leaves buffers as the allocator hands them out.
    #[test]
    fn poison_alloc_is_on_for_1_only() {
        use std::ffi::OsStr;
        assert!(poison_alloc_from(Some(OsStr::new("1"))));
        for off in [None, Some(""), Some("0"), Some("yes"), Some(" 1")] {
            assert!(!poison_alloc_from(off.map(OsStr::new)), "{off:?}");
        }
    }
}
