//! GPU tiers: which kernels, which code and which limits a device gets, from its compute capability.
//!
//! One table, [`ARCHS`], holds every architecture gpu-core knows; [`Arch::for_capability`] picks the
//! row for a device, [`Arch::forced`] the row a test forces on a newer card (`GPU_CORE_FORCE_TIER`,
//! [`FORCE_TIER_ENV`]). [`crate::Device::new`] loads the row's code, applies the row's limits (never the
//! card's own, so a configuration that fits an H100 is never launched where it cannot run) and the ops
//! pick the row's kernels. README and docs/TIERS.md print the same table.
//!
//! Sources of the numbers: shared memory per block is the opt-in maximum of the CUDA C++ Programming
//! Guide's "Technical Specifications per Compute Capability" table (CUDA 13.0): 64 KB on 7.5, 163 KB on
//! 8.0 and 8.7, 99 KB on 8.6, 8.9 and 12.x, 227 KB on 9.0 and 10.x. bf16 tensor cores (`mma.sync` bf16)
//! start at 8.0 (PTX ISA, "Warp-level matrix instructions": `.bf16` needs `sm_80`), as do `mma.sync`
//! m16n8k16 with `.f16` inputs and `cp.async`; f16 `mma.sync` m16n8k8 and `ldmatrix` need `sm_75`. CUDA 13
//! compiles for compute_75 and newer only (CUDA 13.0 release notes: Maxwell, Pascal and Volta removed).

use std::fmt;

/// Environment variable forcing a tier on a newer card, e.g. `GPU_CORE_FORCE_TIER=8.0` on an H100:
/// that tier's code (PTX compiled by the driver's JIT), its limits and its kernels. A test of code
/// paths and limits, not of speed on the real card.
pub const FORCE_TIER_ENV: &str = "GPU_CORE_FORCE_TIER";

/// The kernels a tier runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelSet {
    /// The portable kernels plus the `sm_90a` ones: warp-specialised wgmma/TMA flash attention and the
    /// GEMM with the activation in its epilogue (`kernels/*_sm90a.cu`; compute capability 9.0 alone).
    Hopper,
    /// `mma.sync` bf16 flash attention (`kernels/flash_attn.cu`), cuBLASLt GEMMs with the activation as
    /// its own pass, and the generic kernels (norm, rope, act, layout).
    Portable,
    /// The generic kernels, the f32 CUDA-core attention and the f16 attention on `mma.sync` m16n8k8 with
    /// plain loads: no bf16 tensor cores, so bf16 is refused with advice (f32 and f16 run).
    Turing,
}

/// The f16 flash-attention kernels a tier runs (`kernels/flash_attn.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum F16Attention {
    /// `flash_attn_sm75_hd*_m1_f16`: `mma.sync` m16n8k8, plain global loads prefetched into registers,
    /// one K/V buffer (at most 27 KB of shared memory): compute capability 7.5 and newer.
    Sm75,
    /// `flash_attn_hd*_m{1,2}_f16`: the bf16 kernels' structure (`mma.sync` m16n8k16, `cp.async` double
    /// buffering) with f16 inputs: compute capability 8.0 and newer.
    M16n8k16,
}

impl KernelSet {
    /// The f16 attention kernels of this kernel set: Turing's own, else the m16n8k16 ones (Hopper has no
    /// warp-specialised f16 kernel; it runs the `mma.sync` ones).
    pub fn f16_attention(self) -> F16Attention {
        match self {
            KernelSet::Turing => F16Attention::Sm75,
            KernelSet::Portable | KernelSet::Hopper => F16Attention::M16n8k16,
        }
    }
}

/// Where the portable modules' code comes from (the `sm_90a` modules have one build, for 9.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodeSet {
    /// `kernels/sass/<module>.fatbin` (SASS for sm_90, sm_100, sm_120) with `kernels/ptx/<module>.ptx`
    /// (`.target sm_90`) as the fallback.
    Sm90,
    /// `kernels/sass/sm80/<module>.fatbin`: SASS for sm_80, sm_86, sm_89 and the compute_80 PTX.
    Sm80,
    /// `kernels/sass/sm75/<module>.fatbin`: SASS for sm_75 and the compute_75 PTX.
    Sm75,
}

impl CodeSet {
    /// The directory under `kernels/sass/` (and `kernels/ptx/` for a fresh build), `""` for sm_90's.
    pub fn dir(self) -> &'static str {
        match self {
            CodeSet::Sm90 => "",
            CodeSet::Sm80 => "sm80",
            CodeSet::Sm75 => "sm75",
        }
    }

    /// The SASS architectures this code set's fatbins hold (the repository's `kernels/build_sass.sh`).
    pub fn sass_archs(self) -> &'static [u32] {
        match self {
            CodeSet::Sm90 => &[90, 100, 120],
            CodeSet::Sm80 => &[80, 86, 89],
            CodeSet::Sm75 => &[75],
        }
    }

    /// Whether this code set's fatbins hold SASS a card of compute capability `cc` runs: built for
    /// its architecture or an older one of the same major (binary code is compatible within a
    /// major, never across). Otherwise the driver compiles the fatbin's PTX.
    pub fn has_sass_for(self, cc: (u32, u32)) -> bool {
        self.sass_archs()
            .iter()
            .any(|&s| s / 10 == cc.0 && s % 10 <= cc.1)
    }

    /// The PTX's target (`.target sm_N`): the lowest compute capability the code runs on.
    pub fn ptx_arch(self) -> u32 {
        match self {
            CodeSet::Sm90 => 90,
            CodeSet::Sm80 => 80,
            CodeSet::Sm75 => 75,
        }
    }
}

/// The precisions a tier runs on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Precisions {
    /// bf16 weights and GEMM inputs on the tensor cores, f32 accumulation.
    pub bf16: bool,
    /// f16 GEMM inputs and attention on the tensor cores, f32 accumulation (gpu-core's kernels; every
    /// tier of the table has them).
    pub f16: bool,
    /// f32 GEMMs and the f32 attention (the exactness mode).
    pub f32: bool,
}

/// One row of the tier table: an architecture, what runs there and its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arch {
    /// Compute capability (major, minor).
    pub cc: (u32, u32),
    /// The architecture's name and the cards engines deploy on.
    pub name: &'static str,
    /// The kernels it runs.
    pub kernels: KernelSet,
    /// Where its code comes from.
    pub code: CodeSet,
    /// Shared memory one block may use, static and dynamic together (the opt-in maximum), in bytes.
    pub smem_per_block: usize,
    /// What it computes in.
    pub precisions: Precisions,
    /// Whether this exact architecture ran the GPU tests on real hardware (others: forced on an H100).
    pub verified_on_hardware: bool,
}

const KB: usize = 1024;
const ALL: Precisions = Precisions {
    bf16: true,
    f16: true,
    f32: true,
};

/// Every architecture gpu-core runs on, oldest first.
pub const ARCHS: &[Arch] = &[
    Arch {
        cc: (7, 5),
        name: "Turing (T4, RTX 20xx, Quadro RTX)",
        kernels: KernelSet::Turing,
        code: CodeSet::Sm75,
        smem_per_block: 64 * KB,
        precisions: Precisions {
            bf16: false,
            f16: true,
            f32: true,
        },
        verified_on_hardware: false,
    },
    Arch {
        cc: (8, 0),
        name: "Ampere (A100, A30)",
        kernels: KernelSet::Portable,
        code: CodeSet::Sm80,
        smem_per_block: 163 * KB,
        precisions: ALL,
        verified_on_hardware: false,
    },
    Arch {
        cc: (8, 6),
        name: "Ampere (A10, A10G, A40, RTX 30xx, RTX A6000)",
        kernels: KernelSet::Portable,
        code: CodeSet::Sm80,
        smem_per_block: 99 * KB,
        precisions: ALL,
        verified_on_hardware: false,
    },
    Arch {
        cc: (8, 7),
        name: "Ampere (Jetson AGX Orin)",
        kernels: KernelSet::Portable,
        code: CodeSet::Sm80,
        smem_per_block: 163 * KB,
        precisions: ALL,
        verified_on_hardware: false,
    },
    Arch {
        cc: (8, 9),
        name: "Ada Lovelace (L4, L40S, RTX 40xx, RTX 6000 Ada)",
        kernels: KernelSet::Portable,
        code: CodeSet::Sm80,
        smem_per_block: 99 * KB,
        precisions: ALL,
        verified_on_hardware: false,
    },
    Arch {
        cc: (9, 0),
        name: "Hopper (H100, H200, GH200)",
        kernels: KernelSet::Hopper,
        code: CodeSet::Sm90,
        smem_per_block: 227 * KB,
        precisions: ALL,
        verified_on_hardware: true,
    },
    Arch {
        cc: (10, 0),
        name: "Blackwell (B200, B300, GB200)",
        kernels: KernelSet::Portable,
        code: CodeSet::Sm90,
        smem_per_block: 227 * KB,
        precisions: ALL,
        verified_on_hardware: false,
    },
    Arch {
        cc: (12, 0),
        name: "Blackwell (RTX 50xx, RTX PRO 6000)",
        kernels: KernelSet::Portable,
        code: CodeSet::Sm90,
        smem_per_block: 99 * KB,
        precisions: ALL,
        verified_on_hardware: false,
    },
];

/// Why a device gets no tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TierError {
    /// Older than the oldest architecture CUDA 13 builds for.
    TooOld((u32, u32)),
    /// A forced tier that is not a row of the table.
    UnknownTier(String),
    /// A forced tier this card cannot run (newer than the card, or Hopper's `sm_90a` elsewhere).
    CannotForce {
        /// The tier asked for.
        forced: (u32, u32),
        /// The card's compute capability.
        device: (u32, u32),
        /// Why not.
        why: &'static str,
    },
}

impl fmt::Display for TierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TierError::TooOld((ma, mi)) => write!(
                f,
                "compute capability {ma}.{mi} ({}) is older than 7.5: CUDA 13, which gpu-core is built \
                 with, has no compiler or libraries for it (Maxwell, Pascal and Volta were removed in \
                 CUDA 13.0)",
                arch_family((*ma, *mi))
            ),
            TierError::UnknownTier(name) => write!(
                f,
                "{FORCE_TIER_ENV}={name:?} is not a tier: expected one of {}",
                tier_names()
            ),
            TierError::CannotForce { forced, device, why } => write!(
                f,
                "tier {}.{} cannot be forced on compute capability {}.{}: {why}",
                forced.0, forced.1, device.0, device.1
            ),
        }
    }
}

impl std::error::Error for TierError {}

fn tier_names() -> String {
    ARCHS
        .iter()
        .map(|a| format!("{}.{}", a.cc.0, a.cc.1))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The family name of an architecture older than the table, for the refusal.
fn arch_family(cc: (u32, u32)) -> &'static str {
    match cc.0 {
        7 => "Volta",
        6 => "Pascal",
        5 => "Maxwell",
        3 => "Kepler",
        _ => "pre-Maxwell",
    }
}

impl Arch {
    /// The row for a device of compute capability `cc`: the exact row, else the newest row of the
    /// same major whose minor is not above the device's (10.3 runs 10.0's, 12.1 runs 12.0's; binary
    /// code is compatible within a major), else, for a major newer than the table's, a
    /// [`KernelSet::Portable`] row from the sm_90 PTX (JIT) with the smallest shared-memory limit of
    /// the newest rows. Older than 7.5 is refused by name.
    pub fn for_capability(cc: (u32, u32)) -> Result<Arch, TierError> {
        if cc < (7, 5) {
            return Err(TierError::TooOld(cc));
        }
        if let Some(a) = ARCHS
            .iter()
            .filter(|a| a.cc.0 == cc.0 && a.cc.1 <= cc.1)
            .max_by_key(|a| a.cc.1)
        {
            return Ok(Arch { cc, ..*a });
        }
        Ok(Arch {
            cc,
            name: "newer than the table (portable kernels from the sm_90 PTX)",
            kernels: KernelSet::Portable,
            code: CodeSet::Sm90,
            smem_per_block: 99 * KB,
            precisions: ALL,
            verified_on_hardware: false,
        })
    }

    /// The table's row of compute capability `cc`, checked against the card it is forced on: the
    /// row's code must be built for the card's architecture or an older one (12.0's portable
    /// kernels are sm_90 code, so they run on an H100 with 12.0's limits), and Hopper's `sm_90a`
    /// kernels run on compute capability 9.0 alone.
    pub fn forced(cc: (u32, u32), device: (u32, u32)) -> Result<Arch, TierError> {
        let row = ARCHS
            .iter()
            .find(|a| a.cc == cc)
            .copied()
            .ok_or_else(|| TierError::UnknownTier(format!("{}.{}", cc.0, cc.1)))?;
        let cannot = |why| TierError::CannotForce {
            forced: cc,
            device,
            why,
        };
        if row.kernels == KernelSet::Hopper && device != (9, 0) {
            return Err(cannot(
                "the sm_90a kernels run on compute capability 9.0 alone",
            ));
        }
        let ptx = row.code.ptx_arch();
        if (ptx / 10, ptx % 10) > device {
            return Err(cannot(
                "its code is built for a newer architecture than the card's",
            ));
        }
        Ok(row)
    }

    /// `8.0`-style name of the compute capability.
    pub fn cc_name(&self) -> String {
        format!("{}.{}", self.cc.0, self.cc.1)
    }
}

/// A tier's compute capability from its name: `8.0`, `sm80`, `sm_80` or `80`; an error unless it is
/// a row of [`ARCHS`].
pub fn parse_tier(name: &str) -> Result<(u32, u32), TierError> {
    let unknown = || TierError::UnknownTier(name.to_string());
    let s = name.trim();
    let s = s
        .strip_prefix("sm_")
        .or_else(|| s.strip_prefix("sm"))
        .unwrap_or(s);
    let cc = match s.split_once('.') {
        Some((a, b)) => (
            a.parse().map_err(|_| unknown())?,
            b.parse().map_err(|_| unknown())?,
        ),
        None => {
            let n: u32 = s.parse().map_err(|_| unknown())?;
            (n / 10, n % 10)
        }
    };
    if ARCHS.iter().any(|a| a.cc == cc) {
        Ok(cc)
    } else {
        Err(unknown())
    }
}

/// The tier a [`crate::Device`] runs: its table row, and whether a test forced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tier {
    /// The row whose code, limits and kernels the device uses.
    pub arch: Arch,
    /// The card's own compute capability.
    pub device_cc: (u32, u32),
    /// Whether the row was forced (`GPU_CORE_FORCE_TIER` or [`crate::DeviceOptions::force_tier`])
    /// rather than read from the card.
    pub forced: bool,
}

impl Tier {
    /// The tier for a card of compute capability `device_cc`, or the row `force` names.
    pub fn choose(device_cc: (u32, u32), force: Option<(u32, u32)>) -> Result<Tier, TierError> {
        let native = Arch::for_capability(device_cc)?;
        Ok(match force {
            Some(cc) => Tier {
                arch: Arch::forced(cc, device_cc)?,
                device_cc,
                forced: true,
            },
            None => Tier {
                arch: native,
                device_cc,
                forced: false,
            },
        })
    }
}

impl Tier {
    /// The precision a tower runs in on this tier when none is asked (`auto`): bf16 where the
    /// tensor cores have it (8.0 and newer), else f16 (Turing, vLLM's choice there), else f32.
    pub fn default_precision(&self) -> crate::Precision {
        let p = self.arch.precisions;
        if p.bf16 {
            crate::Precision::Bf16
        } else if p.f16 {
            crate::Precision::F16
        } else {
            crate::Precision::F32
        }
    }

    /// Why this tier cannot run a tower in `p`, or `None` when it can: bf16 needs bf16 tensor
    /// cores (compute capability 8.0 and newer), and a tier without them is advised f16 (vLLM's
    /// advice below 8.0); f16 needs the tier's f16 kernels (every tier of the table).
    pub fn precision_refusal(&self, p: crate::Precision) -> Option<String> {
        use crate::Precision;
        let has = self.arch.precisions;
        match p {
            Precision::Bf16 if !has.bf16 => Some(format!(
                "bf16 needs bf16 tensor cores (compute capability 8.0 or newer); this device runs \
                 tier {self}: use f16 (half precision: --precision f16, precision=\"f16\") or f32"
            )),
            Precision::F16 if !has.f16 => Some(format!(
                "f16 needs the tier's f16 kernels; this device runs tier {self}: use f32"
            )),
            Precision::F32 if !has.f32 => Some(format!(
                "f32 needs the tier's f32 kernels; this device runs tier {self}"
            )),
            Precision::Bf16 | Precision::F16 | Precision::F32 => None,
        }
    }
}

impl fmt::Display for Tier {
    /// `8.0 Ampere (A100, A30), forced on 9.0` or `9.0 Hopper (H100, H200, GH200)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.arch.cc_name(), self.arch.name)?;
        if self.forced {
            write!(f, ", forced on {}.{}", self.device_cc.0, self.device_cc.1)?;
        }
        Ok(())
    }
}

/// The oldest CUDA driver API version gpu-core runs on: CUDA 13.0 (`cuDriverGetVersion` 13000), which
/// NVIDIA ships from driver branch 580 (CUDA 13.0 release notes, "CUDA Driver" table).
pub const MIN_DRIVER_API: i32 = 13_000;

/// An error naming both versions where the driver is older than CUDA 13.0 needs.
pub fn check_driver_version(api: i32) -> Result<(), String> {
    if api >= MIN_DRIVER_API {
        return Ok(());
    }
    Err(format!(
        "the NVIDIA driver supports CUDA {}.{} (cuDriverGetVersion {api}); gpu-core is built for CUDA \
         13.0, which needs driver 580 or newer: update the driver",
        api / 1000,
        (api % 1000) / 10
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatch table at every compute capability engines deploy on: the kernels, the code and
    /// the shared-memory limit each gets, and the refusal below 7.5.
    #[test]
    fn dispatch_table() {
        let row = |cc| Arch::for_capability(cc).map(|a| (a.kernels, a.code, a.smem_per_block / KB));
        assert!(matches!(
            Arch::for_capability((7, 0)),
            Err(TierError::TooOld((7, 0)))
        ));
        assert!(matches!(
            Arch::for_capability((6, 1)),
            Err(TierError::TooOld(_))
        ));
        let msg = Arch::for_capability((7, 0)).unwrap_err().to_string();
        assert!(
            msg.contains("7.0") && msg.contains("Volta") && msg.contains("CUDA 13"),
            "{msg}"
        );
        use CodeSet::*;
        use KernelSet::*;
        assert_eq!(row((7, 5)), Ok((Turing, Sm75, 64)));
        assert_eq!(row((8, 0)), Ok((Portable, Sm80, 163)));
        assert_eq!(row((8, 6)), Ok((Portable, Sm80, 99)));
        assert_eq!(row((8, 7)), Ok((Portable, Sm80, 163)));
        assert_eq!(row((8, 9)), Ok((Portable, Sm80, 99)));
        assert_eq!(row((9, 0)), Ok((Hopper, Sm90, 227)));
        assert_eq!(row((10, 0)), Ok((Portable, Sm90, 227)));
        assert_eq!(row((10, 3)), Ok((Portable, Sm90, 227)));
        assert_eq!(row((12, 0)), Ok((Portable, Sm90, 99)));
        assert_eq!(row((12, 1)), Ok((Portable, Sm90, 99)));
        // a major the table does not know: portable, from the sm_90 PTX, the smallest newest limit
        assert_eq!(row((13, 0)), Ok((Portable, Sm90, 99)));
        // bf16 only where the tensor cores have it; f16 everywhere, on Turing's own attention kernels
        assert!(!Arch::for_capability((7, 5)).unwrap().precisions.bf16);
        assert!(Arch::for_capability((8, 0)).unwrap().precisions.bf16);
        let listed = [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)];
        for cc in listed.into_iter().chain([(13, 0)]) {
            let a = Arch::for_capability(cc).unwrap();
            assert!(a.precisions.f16, "{cc:?}");
            let want = if cc == (7, 5) {
                F16Attention::Sm75
            } else {
                F16Attention::M16n8k16
            };
            assert_eq!(a.kernels.f16_attention(), want, "{cc:?}");
        }
        // the row keeps the card's own capability (8.9 is its own row; 8.8 would run 8.7's)
        assert_eq!(Arch::for_capability((10, 3)).unwrap().cc, (10, 3));
    }

    /// Every row's code set names SASS for the row's own architecture or an older one of its major
    /// (binary compatible), so a listed card never needs the JIT.
    #[test]
    fn every_row_has_sass_within_its_major() {
        for a in ARCHS {
            assert!(
                a.code.has_sass_for(a.cc),
                "{} has no SASS in {:?}",
                a.cc_name(),
                a.code
            );
            assert!(a.code.ptx_arch() <= a.cc.0 * 10 + a.cc.1);
            assert!(a.smem_per_block >= 64 * KB);
        }
    }

    #[test]
    fn forcing_a_tier() {
        let h100 = (9, 0);
        for name in ["8.0", "sm80", "sm_80", "80", " 8.0 "] {
            let t = Tier::choose(h100, Some(parse_tier(name).unwrap())).unwrap();
            assert_eq!(t.arch.cc, (8, 0));
            assert!(t.forced);
            assert_eq!(t.arch.smem_per_block, 163 * KB);
        }
        assert_eq!(
            Tier::choose(h100, Some((7, 5))).unwrap().arch.kernels,
            KernelSet::Turing
        );
        assert_eq!(
            Tier::choose(h100, Some((9, 0))).unwrap().arch.kernels,
            KernelSet::Hopper
        );
        // newer than the card, or Hopper's sm_90a on a Blackwell card
        assert!(matches!(
            Tier::choose((8, 0), Some((9, 0))),
            Err(TierError::CannotForce { .. })
        ));
        assert!(matches!(
            Tier::choose((10, 0), Some((9, 0))),
            Err(TierError::CannotForce { .. })
        ));
        assert!(matches!(
            Tier::choose((8, 6), Some((12, 0))),
            Err(TierError::CannotForce { .. })
        ));
        // 12.0's limits and kernels on an H100: the sm_90 code, 99 KB
        let t = Tier::choose(h100, Some((12, 0))).unwrap();
        assert_eq!(
            (t.arch.code, t.arch.smem_per_block),
            (CodeSet::Sm90, 99 * KB)
        );
        for bad in ["", "ampere", "8.1", "7.0", "9", "x.y", "sm", "8."] {
            assert!(
                matches!(parse_tier(bad), Err(TierError::UnknownTier(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            Tier::choose(h100, Some((8, 1))),
            Err(TierError::UnknownTier(_))
        ));
        let t = Tier::choose(h100, None).unwrap();
        assert!(!t.forced);
        assert_eq!(t.to_string(), "9.0 Hopper (H100, H200, GH200)");
        assert_eq!(
            Tier::choose(h100, Some((8, 0))).unwrap().to_string(),
            "8.0 Ampere (A100, A30), forced on 9.0"
        );
    }

    /// `auto` precision per tier (f16 on Turing, bf16 from 8.0) and the refusals: bf16 on 7.5 with
    /// the advice to use f16, native and forced; f16 and f32 everywhere.
    #[test]
    fn default_precision_and_refusals_per_tier() {
        use crate::Precision;
        for cc in [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)] {
            let t = Tier::choose(cc, None).unwrap();
            let want = if cc == (7, 5) {
                Precision::F16
            } else {
                Precision::Bf16
            };
            assert_eq!(t.default_precision(), want, "{cc:?}");
            assert_eq!(t.precision_refusal(Precision::F16), None, "{cc:?}");
            assert_eq!(t.precision_refusal(Precision::F32), None, "{cc:?}");
            assert_eq!(
                t.precision_refusal(Precision::Bf16).is_some(),
                cc == (7, 5),
                "{cc:?}"
            );
        }
        let forced = Tier::choose((9, 0), Some((7, 5))).unwrap();
        assert_eq!(forced.default_precision(), Precision::F16);
        let why = forced.precision_refusal(Precision::Bf16).unwrap();
        assert!(
            why.contains("bf16 tensor cores") && why.contains("use f16") && why.contains("7.5"),
            "{why}"
        );
        assert_eq!(forced.precision_refusal(Precision::F16), None);
    }

    #[test]
    fn driver_version_gate_names_both_versions() {
        assert!(check_driver_version(13_000).is_ok());
        assert!(check_driver_version(13_020).is_ok());
        let e = check_driver_version(12_040).unwrap_err();
        assert!(
            e.contains("CUDA 12.4") && e.contains("13.0") && e.contains("580"),
            "{e}"
        );
    }
}
