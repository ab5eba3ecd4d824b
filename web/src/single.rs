//! One model on one device with docs/MODEL.md's formula init and formula batch, apart from the
//! page's run: what a peer written from that text trains too, so that the two can be compared
//! loss by loss and step time by step time in one browser (tests/browser/peers_jaxjs.mjs against
//! jax-js). The core trains it as `shardlab train --init formula --data formula` does; the sizes
//! are checked by the page's own checks (`Settings::check`), so errors read as the page's.
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};
use shardlab::exec::{Backend, Trainer};
use shardlab::gpu::GpuContext;
use shardlab::model::{Attention, DataSource, Init};
use shardlab::plan::TrainerOptions;
use wasm_bindgen::prelude::*;

use crate::settings::{Mode, Preset, Settings};
use crate::task::Opt;

/// The run: the model's sizes, dropout, optimizer and learning rate (`{"layers":2,"d_model":128,
/// "heads":4,"seq":64,"batch":8,"vocab":256,"dropout":0,"optimizer":"sgd","lr":0.1}`).
/// Dropout keys come from `seed` and the seed preset's RNG layout; the attention is the core's
/// default (fused) unless named.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub layers: usize,
    pub d_model: usize,
    pub heads: usize,
    pub seq: usize,
    pub batch: usize,
    pub vocab: usize,
    pub dropout: f64,
    pub optimizer: Opt,
    pub lr: f64,
    #[serde(default)]
    pub attention: Attention,
    #[serde(default)]
    pub seed: u64,
}

impl Spec {
    /// The trainer options of the run on one device, or the page's message for what is wrong.
    pub fn options(&self) -> Result<TrainerOptions, String> {
        let settings = Settings {
            mesh: "dp=1".into(),
            layers: self.layers,
            d_model: self.d_model,
            heads: self.heads,
            seq: self.seq,
            batch: self.batch,
            vocab: self.vocab,
            dropout: self.dropout,
            attention: self.attention,
            optimizer: self.optimizer,
            lr: self.lr,
            ..Settings::preset(Preset::Seed)
        };
        let par = settings.check().map_err(|e| format!("{}: {}", e.field, e.message))?;
        Ok(TrainerOptions {
            init: Init::Formula,
            data: DataSource::Formula,
            seed: self.seed,
            ..settings.options(Mode::Single, &par)
        })
    }

    pub fn parse(json: &str) -> Result<Spec, String> {
        serde_json::from_str(json).map_err(|e| format!("the run is not valid: {e}"))
    }
}

/// A formula run on the page's GPU (`Shardlab::single`). Its trainer is built, with the
/// autotuned matmuls, on the first step; answers are JSON values, never rejections.
#[wasm_bindgen]
pub struct SingleRun {
    ctx: Arc<GpuContext>,
    options: Result<TrainerOptions, String>,
    /// Taken out while a step awaits the GPU.
    trainer: Rc<RefCell<Option<Trainer>>>,
    busy: Rc<Cell<bool>>,
}

impl SingleRun {
    pub fn new(ctx: Arc<GpuContext>, spec_json: &str) -> SingleRun {
        SingleRun {
            ctx,
            options: Spec::parse(spec_json).and_then(|s| s.options()),
            trainer: Rc::default(),
            busy: Rc::default(),
        }
    }
}

#[wasm_bindgen]
impl SingleRun {
    /// `{"ok":true,"params":N}` for a valid run, else `{"ok":false,"error"}`.
    pub fn check(&self) -> String {
        match &self.options {
            Ok(o) => json!({"ok": true, "params": o.config.num_params()}),
            Err(e) => json!({"ok": false, "error": e}),
        }
        .to_string()
    }

    /// One train step. Resolves to `{"ok":true,"step","loss","step_ms","build_ms"}`: the loss at
    /// the parameters before the update and the core's own time of the step (`build_ms`, on the
    /// first step only: building the trainer, tuning included); or `{"ok":false,"error"}`.
    pub fn step(&self) -> js_sys::Promise {
        let (ctx, options) = (self.ctx.clone(), self.options.clone());
        let (slot, busy) = (self.trainer.clone(), self.busy.clone());
        wasm_bindgen_futures::future_to_promise(async move {
            let v = step(ctx, options, slot, busy).await;
            Ok(JsValue::from_str(&v.to_string()))
        })
    }
}

async fn step(
    ctx: Arc<GpuContext>,
    options: Result<TrainerOptions, String>,
    slot: Rc<RefCell<Option<Trainer>>>,
    busy: Rc<Cell<bool>>,
) -> Value {
    let fail = |e: String| json!({"ok": false, "error": e});
    let options = match options {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    if busy.replace(true) {
        return fail("a step is already running: await it before asking for the next".into());
    }
    let result = async {
        let mut build_ms = None;
        // Taken out before any await: the borrow ends here.
        let taken = slot.borrow_mut().take();
        let mut trainer = match taken {
            Some(t) => t,
            None => {
                let t0 = shardlab::gpu::now_ms();
                let t = Trainer::new(Backend::Gpu(ctx.clone()), options)
                    .await
                    .map_err(|e| e.to_string())?;
                build_ms = Some(shardlab::gpu::now_ms() - t0);
                t
            }
        };
        let stats = trainer.step().await.map_err(|e| e.to_string());
        let checked = ctx.check().map_err(|e| e.to_string());
        // A failed step leaves the trainer out: the next step starts over.
        let stats = stats.and_then(|s| checked.map(|()| s))?;
        *slot.borrow_mut() = Some(trainer);
        Ok::<_, String>(json!({
            "ok": true,
            "step": stats.step,
            "loss": stats.loss,
            "step_ms": stats.step_ms,
            "build_ms": build_ms,
        }))
    }
    .await;
    busy.set(false);
    result.unwrap_or_else(fail)
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use shardlab::model::{GptConfig, Optimizer};
    use shardlab::plan::Parallel;

    use super::*;

    /// The CPU reference trainer never waits, so one poll finishes it.
    fn ready<T>(f: impl Future<Output = T>) -> T {
        match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("the reference trainer waited"),
        }
    }

    fn tiny(optimizer: &str, lr: f64) -> String {
        let c = GptConfig::tiny();
        format!(
            r#"{{"layers":{},"d_model":{},"heads":{},"seq":{},"batch":{},"vocab":{},"dropout":0,"optimizer":"{optimizer}","lr":{lr}}}"#,
            c.layers, c.d_model, c.heads, c.seq, c.batch, c.vocab
        )
    }

    #[test]
    fn a_run_is_the_formula_model_on_one_device() {
        let o = Spec::parse(&tiny("sgd", 0.1)).unwrap().options().unwrap();
        assert_eq!(o.config, GptConfig::tiny());
        assert_eq!((o.init, o.data.clone()), (Init::Formula, DataSource::Formula));
        assert!(matches!(o.parallel, Parallel::None));
        assert!(matches!(o.optimizer, Optimizer::Sgd { lr } if lr == 0.1));
    }

    #[test]
    fn its_losses_are_docs_model_mds_on_the_cpu_reference() {
        // The first three losses of `shardlab train --cpu --init formula --data formula --opt sgd
        // --lr 0.1` at GptConfig::tiny(), as a JAX script of MODEL.md (`export jax`) prints them.
        let o = Spec::parse(&tiny("sgd", 0.1)).unwrap().options().unwrap();
        let mut t = ready(Trainer::new(Backend::Reference, o)).unwrap();
        let losses: Vec<f32> = (0..3).map(|_| ready(t.step()).unwrap().loss).collect();
        for (got, want) in losses.iter().zip([4.160_937_8, 3.980_537_4, 3.813_523_3]) {
            assert!((got - want).abs() < 1e-5, "{losses:?}");
        }
    }

    #[test]
    fn a_bad_run_is_an_error_naming_its_field() {
        let heads = tiny("sgd", 0.1).replace(r#""heads":4"#, r#""heads":5"#);
        let e = Spec::parse(&heads).unwrap().options().unwrap_err();
        assert!(e.starts_with("heads: "), "{e}");
        let e = Spec::parse(&tiny("adam", 0.1)).unwrap_err();
        assert!(e.contains("unknown variant"), "{e}");
        let e = Spec::parse(&tiny("sgd", 0.1).replace('}', r#","mesh":"dp=2"}"#)).unwrap_err();
        assert!(e.contains("unknown field"), "{e}");
    }
}
