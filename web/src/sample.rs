//! What the model does with what it has learned, for the page's sample panel: its prediction
//! at every position of the task's example, and, for the text task, a few dozen characters it
//! writes from a prompt. Both run the core's forward-only program (`logits_program`) for one
//! example on the reference executor, from parameters read back once per sample; a clock keeps
//! sampling to a small share of the training time.
use serde_json::{json, Value};
use shardlab::exec::{ReferenceExecutor, Tensor, Trainer};
use shardlab::ir::{Program, RngLayout};
use shardlab::model::{logits_program, Dataset, GptConfig};

use crate::settings::Settings;
use crate::task::Task;

/// Characters the text sample writes after its prompt, at most.
const GENERATE_MAX: usize = 40;
/// It stops earlier once it has taken this long (the forward runs on the CPU, and the page's
/// main thread waits for it), but never before this many characters.
const GENERATE_BUDGET_MS: f64 = 200.0;
const GENERATE_MIN: usize = 8;
/// The prompt: the first characters of the example, at most this many (and half the window).
const PROMPT_MAX: usize = 16;
/// Softmax temperature of the text sample, and its seed: the same every time, so the sample
/// changes only because the model did.
const TEMPERATURE: f32 = 0.7;
const SAMPLE_SEED: u64 = 0x5eed;

/// The forward of one example at fixed parameters.
pub struct Sampler {
    prog: Program,
    /// Parameters, then tokens, targets (unused) and key (unused: no dropout).
    inputs: Vec<Tensor>,
    seq: usize,
    vocab: usize,
}

impl Sampler {
    pub fn new(cfg: &GptConfig, layout: RngLayout, params: Vec<Vec<f32>>) -> Result<Self, String> {
        let one = GptConfig {
            batch: 1,
            ..cfg.clone()
        };
        let prog = logits_program(&one, layout).map_err(|e| e.to_string())?;
        let mut inputs: Vec<Tensor> = params.into_iter().map(Tensor::F32).collect();
        inputs.extend([
            Tensor::U32(vec![0; cfg.seq]),
            Tensor::U32(vec![0; cfg.seq]),
            Tensor::U32(vec![0, 0]),
        ]);
        Ok(Self {
            prog,
            inputs,
            seq: cfg.seq,
            vocab: cfg.vocab,
        })
    }

    /// The trainer's current parameters (read back from the GPU once).
    pub async fn of(trainer: &Trainer) -> Result<Self, String> {
        let opts = trainer.options();
        let params = trainer.params().await.map_err(|e| e.to_string())?;
        Self::new(&opts.config, opts.rng_layout, params)
    }

    /// The logits (seq × vocab) for `tokens`, padded with 0 to the window.
    fn logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>, String> {
        let mut window = tokens[..tokens.len().min(self.seq)].to_vec();
        window.resize(self.seq, 0);
        let at = self.inputs.len() - 3;
        self.inputs[at] = Tensor::U32(window);
        let outs = ReferenceExecutor::run(&self.prog, &self.inputs, 0).map_err(|e| e.to_string())?;
        Ok(outs.into_iter().next().map(Tensor::into_f32).unwrap_or_default())
    }

    /// The most likely next token at every position of `tokens` (one window).
    pub fn predict(&mut self, tokens: &[u32]) -> Result<Vec<u32>, String> {
        let logits = self.logits(tokens)?;
        Ok(logits.chunks(self.vocab).take(tokens.len()).map(argmax).collect())
    }

    /// Up to `max_new` tokens after `prompt`, each drawn from the softmax at `TEMPERATURE`
    /// with a fixed seed, the window sliding once the text outgrows `seq`; it stops early once
    /// `budget_ms` have passed (after at least `GENERATE_MIN` tokens).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        budget_ms: f64,
        now: impl Fn() -> f64,
    ) -> Result<Vec<u32>, String> {
        let t0 = now();
        let mut rng = SAMPLE_SEED;
        let mut text = prompt.to_vec();
        let mut out = vec![];
        while out.len() < max_new && (out.len() < GENERATE_MIN || now() - t0 < budget_ms) {
            let start = text.len().saturating_sub(self.seq);
            let window = &text[start..];
            let logits = self.logits(window)?;
            let row = &logits[(window.len() - 1) * self.vocab..window.len() * self.vocab];
            let next = draw(row, TEMPERATURE, splitmix(&mut rng));
            text.push(next);
            out.push(next);
        }
        Ok(out)
    }
}

fn argmax(row: &[f32]) -> u32 {
    let best = row
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b });
    best.0 as u32
}

/// A token from softmax(row / temperature), by the uniform number `u` in [0, 1).
fn draw(row: &[f32], temperature: f32, u: f64) -> u32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = row.iter().map(|x| (((x - max) / temperature) as f64).exp()).collect();
    let total: f64 = weights.iter().sum();
    if !total.is_finite() || total <= 0.0 {
        return argmax(row);
    }
    let mut left = u * total;
    for (i, w) in weights.iter().enumerate() {
        if left < *w {
            return i as u32;
        }
        left -= w;
    }
    (row.len() - 1) as u32
}

/// SplitMix64's next number, as a uniform f64 in [0, 1).
fn splitmix(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The task's example (the first of step 0's batch), and how the page shows its tokens:
/// `{"ok","task","inputs","targets","names","learnable"}`. `names[id]` is a token's text;
/// `learnable` are the positions whose target follows from what came before.
pub fn example(settings: &Settings, data: &Dataset) -> Value {
    let batch = data.batch(0);
    let t = settings.seq;
    let (inputs, targets) = (&batch.inputs[..t], &batch.targets[..t]);
    let numbers = || (0..settings.vocab).map(|i| i.to_string()).collect::<Vec<_>>();
    let (names, learnable): (Vec<String>, Vec<usize>) = match settings.task {
        Task::Copy | Task::Reverse => {
            // After the separator 0 the rest of the row is the run again (or reversed).
            let sep = inputs.iter().position(|x| *x == 0);
            (numbers(), (0..t).filter(|i| sep.is_some_and(|s| *i >= s)).collect())
        }
        Task::Modadd => {
            // Every row starts with an equation, so its second token is '+' (= p) and '=' is p + 1.
            let plus = inputs.get(1).copied().unwrap_or(u32::MAX);
            let mut names = numbers();
            for (id, sign) in [(plus, "+"), (plus.wrapping_add(1), "=")] {
                if let Some(n) = names.get_mut(id as usize) {
                    *n = sign.into();
                }
            }
            (names, (0..t).filter(|i| inputs[*i] == plus.wrapping_add(1)).collect())
        }
        Task::Text => {
            let mut names: Vec<String> = data.chars().iter().map(|c| c.to_string()).collect();
            names.resize(settings.vocab, String::new());
            (names, (0..t).collect())
        }
    };
    json!({
        "ok": true,
        "task": settings.task,
        "inputs": inputs,
        "targets": targets,
        "names": names,
        "learnable": learnable,
    })
}

/// One sample of the model: its prediction for the example and, for the text task, the text
/// it writes from the example's first characters. `{"prediction","prompt"?,"generated"?,"ms"}`.
pub async fn take(trainer: &Trainer, settings: &Settings) -> Result<Value, String> {
    let t0 = shardlab::gpu::now_ms();
    let opts = trainer.options();
    let data = Dataset::new(opts.data.clone(), &opts.config, opts.seed).map_err(|e| e.to_string())?;
    let mut sampler = Sampler::of(trainer).await?;
    let batch = data.batch(0);
    let row = &batch.inputs[..settings.seq];
    let prediction = sampler.predict(row)?;
    let mut out = json!({"prediction": prediction});
    if settings.task == Task::Text {
        let prompt = &row[..row.len().min(PROMPT_MAX).min(settings.seq.div_ceil(2))];
        let generated = sampler.generate(prompt, GENERATE_MAX, GENERATE_BUDGET_MS, shardlab::gpu::now_ms)?;
        out["prompt"] = json!(prompt);
        out["generated"] = json!(generated);
    }
    out["ms"] = json!(shardlab::gpu::now_ms() - t0);
    Ok(out)
}

/// Samples at the first step, then once at least `EVERY` steps have passed and the training
/// time since the last sample is `SHARE` times what that sample took: so sampling costs at
/// most about a tenth of the training time, however slow the CPU's forward is.
#[derive(Clone, Debug, Default)]
pub struct SampleClock {
    sampled: bool,
    steps: u64,
    train_ms: f64,
    cost_ms: f64,
}

impl SampleClock {
    pub const EVERY: u64 = 5;
    const SHARE: f64 = 9.0;

    pub fn due(&self) -> bool {
        !self.sampled || (self.steps >= Self::EVERY && self.train_ms >= Self::SHARE * self.cost_ms)
    }

    pub fn stepped(&mut self, step_ms: f64) {
        self.steps += 1;
        self.train_ms += step_ms.max(0.0);
    }

    pub fn sampled(&mut self, cost_ms: f64) {
        *self = Self {
            sampled: true,
            steps: 0,
            train_ms: 0.0,
            cost_ms: cost_ms.max(0.0),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Preset;
    use shardlab::model::{init_params, Init};

    fn tiny(task: Task) -> (Settings, GptConfig) {
        let s = Settings {
            task,
            seq: 16,
            vocab: 32,
            ..Settings::preset(Preset::Dp)
        };
        let cfg = GptConfig {
            layers: 1,
            d_model: 16,
            heads: 2,
            batch: 2,
            ..s.config()
        };
        (s, cfg)
    }

    fn sampler(cfg: &GptConfig) -> Sampler {
        let params = init_params(cfg, Init::Random { seed: 1 });
        Sampler::new(cfg, RngLayout::Original, params).unwrap()
    }

    #[test]
    fn generation_is_deterministic_and_stays_in_the_vocab() {
        let (_, cfg) = tiny(Task::Text);
        let prompt = [1, 2, 3, 4];
        let a = sampler(&cfg).generate(&prompt, 40, f64::INFINITY, || 0.0).unwrap();
        let b = sampler(&cfg).generate(&prompt, 40, f64::INFINITY, || 0.0).unwrap();
        assert_eq!(a.len(), 40, "the window slides past seq 16");
        assert_eq!(a, b);
        assert!(a.iter().all(|x| (*x as usize) < cfg.vocab));
    }

    #[test]
    fn generation_stops_at_its_time_budget_but_not_before_its_minimum() {
        let (_, cfg) = tiny(Task::Text);
        // A clock that advances 100 ms each time it is read: read once at the start, then once
        // per token after the minimum.
        let run = |budget: f64| {
            let clock = std::cell::Cell::new(0.0);
            let now = || {
                clock.set(clock.get() + 100.0);
                clock.get()
            };
            sampler(&cfg).generate(&[1], 40, budget, now).unwrap().len()
        };
        assert_eq!(run(50.0), GENERATE_MIN);
        assert_eq!(run(250.0), GENERATE_MIN + 2);
    }

    #[test]
    fn prediction_matches_the_core_forward_for_each_position() {
        let (s, cfg) = tiny(Task::Copy);
        let data = Dataset::new(s.task.data(), &cfg, 0).unwrap();
        let row = &data.batch(0).inputs[..cfg.seq];
        let p = sampler(&cfg).predict(row).unwrap();
        assert_eq!(p.len(), cfg.seq);
        // The same forward at batch 2 (the core's program), first row.
        let prog = logits_program(&cfg, RngLayout::Original).unwrap();
        let mut inputs: Vec<Tensor> = init_params(&cfg, Init::Random { seed: 1 })
            .into_iter()
            .map(Tensor::F32)
            .collect();
        let batch = data.batch(0);
        inputs.extend([
            Tensor::U32(batch.inputs.clone()),
            Tensor::U32(batch.targets),
            Tensor::U32(vec![0, 0]),
        ]);
        let logits = ReferenceExecutor::run(&prog, &inputs, 0).unwrap()[0].f32().to_vec();
        let want: Vec<u32> = logits[..cfg.seq * cfg.vocab].chunks(cfg.vocab).map(argmax).collect();
        assert_eq!(p, want);
    }

    #[test]
    fn each_task_example_names_its_tokens_and_its_learnable_positions() {
        for task in crate::task::TASKS {
            let (s, cfg) = tiny(task);
            let data = Dataset::new(task.data(), &cfg, 0).unwrap();
            let ex = example(&s, &data);
            let inputs: Vec<u64> = ex["inputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            let learnable: Vec<u64> = ex["learnable"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            let names = ex["names"].as_array().unwrap();
            assert_eq!(names.len(), s.vocab, "{task:?}");
            assert!(!learnable.is_empty(), "{task:?}");
            match task {
                Task::Copy | Task::Reverse => {
                    assert_eq!(learnable[0], inputs.iter().position(|x| *x == 0).unwrap() as u64)
                }
                Task::Modadd => {
                    assert_eq!(names[inputs[1] as usize], "+");
                    assert!(learnable.iter().all(|i| names[inputs[*i as usize] as usize] == "="));
                }
                Task::Text => {
                    let text: String = inputs.iter().map(|i| names[*i as usize].as_str().unwrap()).collect();
                    assert!(crate::task::text().contains(&text), "{text}");
                }
            }
        }
    }

    #[test]
    fn the_clock_samples_first_then_keeps_sampling_to_a_tenth_of_training() {
        let mut c = SampleClock::default();
        assert!(c.due());
        c.sampled(100.0);
        for _ in 0..SampleClock::EVERY {
            assert!(!c.due());
            c.stepped(10.0);
        }
        // Five 10 ms steps are not yet nine times a 100 ms sample.
        assert!(!c.due());
        for _ in 0..85 {
            c.stepped(10.0);
        }
        assert!(c.due());
        // Cheap samples of slow steps: every EVERY steps.
        c.sampled(1.0);
        for _ in 0..SampleClock::EVERY {
            assert!(!c.due());
            c.stepped(1000.0);
        }
        assert!(c.due());
    }
}
