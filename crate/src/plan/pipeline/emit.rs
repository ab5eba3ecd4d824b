//! Traces a schedule's passes into one program for every device, as one SPMD body expresses
//! per-stage programs: each pass is its stage's work alone (the instructions run on that
//! stage's devices, [`Owner`]), traced in the lockstep steps of [`Table::steps`]; at the end of
//! a step one `ppermute` carries every stage's activation to the next virtual stage and one
//! every cotangent back. A backward pass is the pullback of its own forward (`jax.vjp`),
//! reading the activations that forward saved: nothing is recomputed unless remat says so,
//! and a stage holds a microbatch's activations from its forward to its backward, as Megatron's
//! ranks do. A split backward's weight-gradient work moves to its W slot.
use std::collections::{BTreeSet, HashMap};

use super::layout::StageLayout;
use super::table::{Pass, Table};
use crate::autodiff::vjp_with;
use crate::ir::{Builder, IrError, Op, Owner, PassSpan, Program, RngLayout, ValueId};
use crate::model::{block, embed, head, Activations, GptConfig, Local, Stage};

/// Parameters per block (docs/MODEL.md): ln1 (2), qkv (2), proj (2), ln2 (2), fc (2), out (2).
pub(super) const PER_BLOCK: usize = 12;

/// What the passes compute with.
pub(super) struct Stages<'a> {
    pub cfg: &'a GptConfig,
    /// The model as one chunk sees it: `layout.rows()` blocks.
    pub chunk_cfg: GptConfig,
    pub layout: &'a StageLayout,
    pub table: &'a Table,
    /// Per chunk: the model's parameters as its passes read them (the embeddings, the chunk's
    /// rows of every stacked block parameter on this device, the final norm and head).
    pub chunk_params: Vec<Vec<ValueId>>,
    /// Per chunk, per position of `chunk_params`: the program input (held parameter) it is.
    pub held_of: Vec<Vec<usize>>,
    /// Each parameter the program holds, as this device's passes read it (by held position).
    pub view: Vec<ValueId>,
    pub tokens: Vec<ValueId>,
    pub targets: Vec<ValueId>,
    /// Each microbatch's key (the one-device run's).
    pub keys: Vec<ValueId>,
    pub rng_layout: RngLayout,
    pub local: Local,
    /// 1 / (M * token shards): a microbatch's share of the step's mean loss on one device.
    pub scale: f32,
}

/// What the schedule traced: the sum of the microbatches' losses (on the last stage), each
/// held parameter's gradient on this device (in the view's shape, before any sum over
/// devices), and where the first backward work began.
pub(super) struct Traced {
    pub losses: ValueId,
    pub grads: Vec<ValueId>,
    pub forward_end: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Dir {
    /// Activations, to the next virtual stage.
    Down,
    /// Cotangents, to the previous one.
    Up,
}

/// A forward pass as its backward reads it.
struct Forward {
    /// Its first instruction: the pullback differentiates from there.
    start: usize,
    /// What it received (None on the first virtual stage, which embeds the tokens).
    input: Option<ValueId>,
    /// Its activation sent on, or on the last virtual stage the microbatch's loss.
    output: ValueId,
}

/// A split backward's weight work, waiting for its W slot.
struct Deferred {
    grads: Vec<(usize, ValueId)>,
    instrs: Vec<usize>,
}

fn keep(_: &mut Builder, _: usize, g: ValueId) -> ValueId {
    g
}

impl Stages<'_> {
    fn acts(&self, chunk: usize, microbatch: usize, first: usize) -> Activations<'_> {
        Activations {
            params: &self.chunk_params[chunk],
            tokens: self.tokens[microbatch],
            targets: self.targets[microbatch],
            key: self.keys[microbatch],
            rng_layout: self.rng_layout,
            local: Local {
                stage: Some(Stage { first }),
                ..self.local.clone()
            },
        }
    }

    /// The positions of `chunk_params` a pass of virtual stage `k` reads: its blocks, the
    /// embeddings on the first, the final norm and head on the last.
    fn reads(&self, k: usize, blocks: usize) -> Vec<usize> {
        let last = self.table.virtual_stages() - 1;
        let tail = 2 + PER_BLOCK * self.layout.rows();
        let mut p = BTreeSet::new();
        if k == 0 {
            p.extend([0, 1]);
        }
        p.extend(2..2 + PER_BLOCK * blocks);
        if k == last {
            p.extend(tail..self.chunk_params[0].len());
            if self.cfg.tied {
                p.insert(0);
            }
        }
        p.into_iter().collect()
    }
}

/// Traces `st.table`'s passes.
pub(super) fn trace(b: &mut Builder, st: &Stages) -> Result<Traced, IrError> {
    let table = st.table;
    let (pp, last) = (table.stages, table.virtual_stages() - 1);
    let mut forwards: HashMap<(usize, usize), Forward> = HashMap::new();
    let mut inbox: HashMap<(Dir, usize, usize), ValueId> = HashMap::new();
    let mut deferred: HashMap<(usize, usize, usize), Deferred> = HashMap::new();
    let mut sums: Vec<Vec<Option<ValueId>>> = vec![vec![None; st.view.len()]; pp];
    let mut losses = vec![];
    // (instructions, the position they move to): split backwards' weight work.
    let mut moves: Vec<(Vec<usize>, usize)> = vec![];
    let mut first_backward = None;
    for step in table.steps() {
        let mut sends: Vec<(Dir, usize, ValueId, usize, usize)> = vec![];
        for (s, a) in step {
            b.set_owner(Owner::stage(s));
            let k = table.virtual_stage(s, a.chunk);
            let (first, blocks) = st.layout.run(s, a.chunk);
            let j = a.microbatch;
            let at = b.program().instrs.len();
            let span = |b: &mut Builder, instrs: Vec<usize>| {
                b.record_pass(PassSpan {
                    stage: s,
                    action: a,
                    instrs,
                })
            };
            match a.pass {
                Pass::Forward => {
                    let acts = st.acts(a.chunk, j, first);
                    let input = match k {
                        0 => None,
                        _ => Some(
                            inbox
                                .remove(&(Dir::Down, j, k))
                                .expect("sent by the virtual stage before"),
                        ),
                    };
                    let mut y = match input {
                        Some(x) => x,
                        None => embed(b, &acts),
                    };
                    for l in 0..blocks {
                        y = b.checkpoint(st.cfg.remat.policy(), |b| block(b, &st.chunk_cfg, &acts, l, y));
                    }
                    let output = if k == last {
                        let logits = head(b, &st.chunk_cfg, &acts, y);
                        let ce = b.cross_entropy(logits, st.targets[j]);
                        let loss = b.mean(ce);
                        losses.push(loss);
                        loss
                    } else {
                        sends.push((Dir::Down, s, y, j, k + 1));
                        y
                    };
                    forwards.insert(
                        (j, k),
                        Forward {
                            start: at,
                            input,
                            output,
                        },
                    );
                    let end = b.program().instrs.len();
                    span(b, (at..end).collect());
                }
                Pass::Backward => {
                    first_backward.get_or_insert(at);
                    let f = forwards.remove(&(j, k)).expect("a backward follows its forward");
                    let ct = match k == last {
                        true => b.emit1(
                            Op::Full {
                                shape: vec![],
                                value: st.scale,
                            },
                            &[],
                        ),
                        false => inbox
                            .remove(&(Dir::Up, j, k))
                            .expect("sent back by the virtual stage after"),
                    };
                    let reads = st.reads(k, blocks);
                    let wrt: Vec<ValueId> = f
                        .input
                        .into_iter()
                        .chain(reads.iter().map(|&p| st.chunk_params[a.chunk][p]))
                        .collect();
                    let start = b.program().instrs.len();
                    let g = vjp_with(b, &[(f.output, ct)], &wrt, f.start, &mut keep)?;
                    let end = b.program().instrs.len();
                    let (dx, param_grads) = match f.input {
                        Some(_) => (Some(g[0]), &g[1..]),
                        None => (None, &g[..]),
                    };
                    let grads: Vec<(usize, ValueId)> = reads
                        .iter()
                        .map(|&p| st.held_of[a.chunk][p])
                        .zip(param_grads.iter().copied())
                        .collect();
                    if let Some(dx) = dx {
                        sends.push((Dir::Up, s, dx, j, k - 1));
                    }
                    match dx.filter(|_| table.split) {
                        // Split: the input gradient's work now, the rest at the W slot.
                        Some(dx) => {
                            let needed = cone(b.program(), dx, start..end);
                            let (now, later): (Vec<usize>, Vec<usize>) = (start..end).partition(|i| needed.contains(i));
                            span(b, (at..start).chain(now).collect());
                            deferred.insert((s, j, a.chunk), Deferred { grads, instrs: later });
                        }
                        // Whole (or nothing waits on its input gradient): everything now.
                        None => {
                            if table.split {
                                deferred.insert(
                                    (s, j, a.chunk),
                                    Deferred {
                                        grads: vec![],
                                        instrs: vec![],
                                    },
                                );
                            }
                            accumulate(b, &mut sums[s], &grads);
                            span(b, (at..b.program().instrs.len()).collect());
                        }
                    }
                }
                Pass::Weight => {
                    let w = deferred
                        .remove(&(s, j, a.chunk))
                        .expect("a weight pass follows its backward");
                    moves.push((w.instrs.clone(), at));
                    accumulate(b, &mut sums[s], &w.grads);
                    let end = b.program().instrs.len();
                    span(b, w.instrs.into_iter().chain(at..end).collect());
                }
            }
        }
        send(b, pp, sends, &mut inbox);
    }
    debug_assert!(inbox.is_empty() && deferred.is_empty() && forwards.is_empty());
    let forward_end = first_backward.unwrap_or(b.program().instrs.len());
    move_weight_work(b, &moves);
    b.set_owner(Owner::stage(table.stage_of(last)));
    let losses = losses
        .into_iter()
        .reduce(|a, x| b.add(a, x))
        .expect("at least one microbatch");
    let grads = (0..st.view.len())
        .map(|h| {
            let per_stage: Vec<ValueId> = sums.iter().filter_map(|s| s[h]).collect();
            match per_stage.into_iter().reduce(|a, x| join_add(b, a, x)) {
                Some(g) => g,
                None => {
                    b.set_owner(Owner::Every);
                    b.emit1(
                        Op::Full {
                            shape: b.shape(st.view[h]),
                            value: 0.0,
                        },
                        &[],
                    )
                }
            }
        })
        .collect();
    b.set_owner(Owner::Every);
    Ok(Traced {
        losses,
        grads,
        forward_end,
    })
}

/// `a + x` on the stages of both: values that are zero outside their stages add up to each
/// stage's own.
fn join_add(b: &mut Builder, a: ValueId, x: ValueId) -> ValueId {
    let owner = b
        .owner_of(a)
        .unwrap_or_default()
        .join(b.owner_of(x).unwrap_or_default());
    let before = b.set_owner(owner);
    let sum = b.add(a, x);
    b.set_owner(before);
    sum
}

/// Adds each `(held parameter, gradient)` into the stage's running sum.
fn accumulate(b: &mut Builder, sums: &mut [Option<ValueId>], grads: &[(usize, ValueId)]) {
    for &(h, g) in grads {
        sums[h] = Some(match sums[h] {
            Some(prev) => b.add(prev, g),
            None => g,
        });
    }
}

/// The step's sends: one `ppermute` down the stages for every activation and one up for every
/// cotangent (each stage sends at most one of each a step). What the stages send is zero on
/// the others, so their sum is each stage's own; the result is the receivers'.
fn send(
    b: &mut Builder,
    pp: usize,
    sends: Vec<(Dir, usize, ValueId, usize, usize)>,
    inbox: &mut HashMap<(Dir, usize, usize), ValueId>,
) {
    for dir in [Dir::Down, Dir::Up] {
        let these: Vec<&(Dir, usize, ValueId, usize, usize)> = sends.iter().filter(|x| x.0 == dir).collect();
        let Some(value) = these.iter().map(|x| x.2).reduce(|a, x| join_add(b, a, x)) else {
            continue;
        };
        let to = |s: usize| match dir {
            Dir::Down => (s + 1) % pp,
            Dir::Up => (s + pp - 1) % pp,
        };
        let perm: Vec<(usize, usize)> = these.iter().map(|x| (x.1, to(x.1))).collect();
        let receivers = these
            .iter()
            .map(|x| Owner::stage(to(x.1)))
            .reduce(Owner::join)
            .expect("one send at least");
        b.set_owner(receivers);
        let received = b.ppermute(value, "pp", &perm);
        for &&(_, _, _, j, k) in &these {
            inbox.insert((dir, j, k), received);
        }
    }
    b.set_owner(Owner::Every);
}

/// The instructions among `range` that `v` is computed from (`v`'s own included).
fn cone(prog: &Program, v: ValueId, range: std::ops::Range<usize>) -> BTreeSet<usize> {
    let made_by: HashMap<ValueId, usize> = range
        .clone()
        .flat_map(|i| prog.instrs[i].outputs.iter().map(move |o| (*o, i)))
        .collect();
    let mut out = BTreeSet::new();
    let mut todo = vec![v];
    while let Some(x) = todo.pop() {
        if let Some(&i) = made_by.get(&x) {
            if out.insert(i) {
                todo.extend(prog.instrs[i].inputs.iter().copied());
            }
        }
    }
    out
}

/// Moves each split backward's weight work to its W slot: right before the instruction that
/// was at that position (nothing between reads it: only the W slot's sums do).
fn move_weight_work(b: &mut Builder, moves: &[(Vec<usize>, usize)]) {
    if moves.iter().all(|(m, _)| m.is_empty()) {
        return;
    }
    let n = b.program().instrs.len();
    let mut moved = vec![false; n];
    let mut before: HashMap<usize, Vec<usize>> = HashMap::new();
    for (instrs, at) in moves {
        for &i in instrs {
            moved[i] = true;
        }
        before.entry(*at).or_default().extend(instrs.iter().copied());
    }
    let mut order = Vec::with_capacity(n);
    for (p, &gone) in moved.iter().enumerate() {
        if let Some(list) = before.get(&p) {
            order.extend(list.iter().copied());
        }
        if !gone {
            order.push(p);
        }
    }
    // Weight work placed at the end of the program.
    if let Some(list) = before.get(&n) {
        order.extend(list.iter().copied());
    }
    b.reorder(&order);
}
