//! The choices tuned per adapter, kept in the context's state ([`Tuning::with`]): typed,
//! so a misspelt variant cannot silently fall back. The matmul choices persist between
//! processes as a [`TuningCache`] (the command line keeps one file per adapter), so that every
//! process of the same benchmark runs the same kernels.
use std::collections::{BTreeMap, HashMap};

use super::matmul::{MatmulClass, Variant};
use super::RowStrategy;
use crate::gpu::GpuContext;

#[derive(Clone, Debug, Default)]
pub struct Tuning {
    /// The row strategy of every row-wise kernel; `None` picks per adapter and row length.
    pub rowwise: Option<RowStrategy>,
    /// One matmul variant for every shape class (benchmarks and tests that compare programs);
    /// overrides [`Tuning::matmul`].
    pub matmul_pin: Option<Variant>,
    /// The autotuner's matmul variant per shape class.
    pub matmul: HashMap<MatmulClass, Variant>,
    /// Shape classes the autotuner timed in this process (not taken from a cache).
    pub tuned: usize,
    /// How fused attention runs (tests pin it); `None` picks per adapter
    /// ([`super::attention::lowering`]).
    pub attention: Option<super::attention::Lowering>,
}

/// The file form of the matmul choices of one adapter.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TuningCache {
    /// [`TuningCache::VERSION`]: a file of another version is not read.
    pub version: u32,
    /// The adapter the choices were timed on (name, backend, driver): a file copied from
    /// another adapter is not read.
    pub adapter: String,
    /// Shape class (`matmul/large/aligned/nn/single`) to variant name (`tex16`).
    pub matmul: BTreeMap<String, String>,
}

impl TuningCache {
    /// Bumped when shape classes or variants change meaning, so old choices are timed again
    /// (3: block8 reads operands already in its layout without a pack pass; 4: the sg variant;
    /// 5: block16; 6: the GPU variants gpu64, gpu128 and coop8, timed on GPUs on a 1024-cube).
    pub const VERSION: u32 = 6;
}

impl Tuning {
    /// Runs `f` on the choices of `ctx`'s adapter; `None` only after a panic while they were held.
    pub fn with<R>(ctx: &GpuContext, f: impl FnOnce(&mut Tuning) -> R) -> Option<R> {
        ctx.with_state(f)
    }

    /// The matmul choices, for `adapter`.
    pub fn to_cache(&self, adapter: &str) -> TuningCache {
        TuningCache {
            version: TuningCache::VERSION,
            adapter: adapter.to_string(),
            matmul: self
                .matmul
                .iter()
                .map(|(class, v)| (class.to_string(), v.name().to_string()))
                .collect(),
        }
    }

    /// Takes the matmul choices of `cache` when it was written for `adapter` by this version;
    /// otherwise says why not and changes nothing. Returns the number of classes taken.
    pub fn load_cache(&mut self, cache: &TuningCache, adapter: &str) -> Result<usize, String> {
        if cache.version != TuningCache::VERSION {
            return Err(format!(
                "it has version {}, this shardlab writes {}",
                cache.version,
                TuningCache::VERSION
            ));
        }
        if cache.adapter != adapter {
            return Err(format!("it was tuned on `{}`, not on `{adapter}`", cache.adapter));
        }
        let mut choices = HashMap::new();
        for (class, variant) in &cache.matmul {
            let c = MatmulClass::parse(class).ok_or_else(|| format!("unknown shape class `{class}`"))?;
            let v = Variant::from_name(variant).ok_or_else(|| format!("unknown matmul variant `{variant}`"))?;
            choices.insert(c, v);
        }
        let n = choices.len();
        self.matmul.extend(choices);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::{class_key, MatmulShape};

    fn tuned() -> Tuning {
        let mut t = Tuning::default();
        let big = MatmulShape::new(1, 1024, 1024, 1024);
        let odd = MatmulShape {
            trans_b: true,
            ..MatmulShape::new(8, 30, 17, 9)
        };
        t.matmul.insert(class_key(&big), Variant::Tex16);
        t.matmul.insert(class_key(&odd), Variant::Naive);
        t
    }

    #[test]
    fn the_matmul_choices_round_trip_through_the_cache_file_form() {
        let t = tuned();
        let text = serde_json::to_string(&t.to_cache("lavapipe")).unwrap();
        let back: TuningCache = serde_json::from_str(&text).unwrap();
        let mut u = Tuning::default();
        assert_eq!(u.load_cache(&back, "lavapipe"), Ok(2));
        assert_eq!(u.matmul, t.matmul);
    }

    #[test]
    fn a_cache_of_another_adapter_version_or_vocabulary_is_refused_whole() {
        let good = tuned().to_cache("lavapipe");
        let mut u = Tuning::default();
        let why = u.load_cache(&good, "swiftshader").unwrap_err();
        assert!(why.contains("lavapipe"), "{why}");
        let old = TuningCache {
            version: 0,
            ..good.clone()
        };
        assert!(u.load_cache(&old, "lavapipe").unwrap_err().contains("version"));
        let mut bad = good.clone();
        bad.matmul
            .insert("matmul/huge/aligned/nn/single".into(), "tex16".into());
        assert!(u.load_cache(&bad, "lavapipe").unwrap_err().contains("shape class"));
        let mut bad = good;
        bad.matmul
            .insert("matmul/small/aligned/nn/single".into(), "tex99".into());
        assert!(u.load_cache(&bad, "lavapipe").unwrap_err().contains("tex99"));
        assert!(u.matmul.is_empty(), "nothing is taken from a refused cache");
    }
}
