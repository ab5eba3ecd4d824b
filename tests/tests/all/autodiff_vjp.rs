//! Every VJP rule against central finite differences, on the CPU reference executor:
//! f(x) = sum(op(x) * w) with fixed random w, so the cotangent reaching the op is generic.
use shardlab::autodiff::grad;
use shardlab::exec::{ReferenceExecutor, Tensor};
use shardlab::ir::{Builder, DType, Op, RngLayout, Role, ValueId};
use shardlab_tests::rand_vec;

/// Builds f(inputs) = sum(body(inputs) * w); checks d f / d input k for every f32 input.
fn check_vjp(what: &str, inputs: &[(&[usize], DType)], body: impl Fn(&mut Builder, &[ValueId]) -> ValueId) {
    let mut b = Builder::new();
    let vals: Vec<ValueId> = inputs
        .iter()
        .enumerate()
        .map(|(i, (s, dt))| b.input(&format!("x{i}"), s, *dt, Role::Other))
        .collect();
    let y = body(&mut b, &vals);
    let ys = b.shape(y);
    let w = b.input("w", &ys, DType::F32, Role::Other);
    let yw = b.mul(y, w);
    let all: Vec<usize> = (0..ys.len()).collect();
    let f = b.sum(yw, &all);
    let wrt: Vec<ValueId> = vals
        .iter()
        .zip(inputs)
        .filter(|(_, (_, dt))| *dt == DType::F32)
        .map(|(v, _)| *v)
        .collect();
    let grads = grad(&mut b, f, &wrt).unwrap();
    b.output(f);
    for g in &grads {
        b.output(*g);
    }
    let prog = b.finish().unwrap();

    let mut feed: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(i, (s, dt))| {
            let n: usize = s.iter().product();
            match dt {
                DType::F32 => Tensor::F32(rand_vec(n, 7 + i as u32)),
                DType::U32 => Tensor::U32((0..n as u32).map(|k| (k * 7 + 3) % 5).collect()),
            }
        })
        .collect();
    let nw: usize = ys.iter().product();
    feed.push(Tensor::F32(rand_vec(nw, 99)));
    let out = ReferenceExecutor::run(&prog, &feed, 1).unwrap();

    let f_at = |feed: &[Tensor]| ReferenceExecutor::run(&prog, feed, 1).unwrap()[0].scalar() as f64;
    let mut gi = 0;
    for (k, (_, dt)) in inputs.iter().enumerate() {
        if *dt != DType::F32 {
            continue;
        }
        gi += 1;
        let analytic = out[gi].f32().to_vec();
        let n = analytic.len();
        // Probe a spread of coordinates (all of them for small inputs).
        let probes: Vec<usize> = if n <= 24 {
            (0..n).collect()
        } else {
            (0..24).map(|j| j * n / 24).collect()
        };
        for &j in &probes {
            let eps = 1e-2f32;
            let mut plus = feed.clone();
            let mut minus = feed.clone();
            if let Tensor::F32(v) = &mut plus[k] {
                v[j] += eps;
            }
            if let Tensor::F32(v) = &mut minus[k] {
                v[j] -= eps;
            }
            let numeric = (f_at(&plus) - f_at(&minus)) / (2.0 * eps as f64);
            let a = analytic[j] as f64;
            assert!(
                (a - numeric).abs() <= 2e-3 + 2e-2 * numeric.abs(),
                "{what}: d/d x{k}[{j}] analytic {a}, finite differences {numeric}"
            );
        }
    }
}

const F: DType = DType::F32;

#[test]
fn structural_op_gradients_match_finite_differences() {
    check_vjp("reshape", &[(&[2, 6], F)], |b, x| b.reshape(x[0], &[3, 4]));
    check_vjp("transpose", &[(&[2, 3, 4], F)], |b, x| b.transpose(x[0], &[2, 0, 1]));
    check_vjp("broadcast_in_dim", &[(&[3, 1], F)], |b, x| {
        b.broadcast_in_dim(x[0], &[2, 3, 4], &[1, 2])
    });
    check_vjp("split", &[(&[2, 5], F)], |b, x| {
        let p = b.split(x[0], 1, &[2, 3]);
        let s = b.scale(p[0], 3.0);
        let t = b.sum(p[1], &[1]);
        let t = b.reshape(t, &[2, 1]);
        b.concat(&[s, t], 1)
    });
    check_vjp("concat", &[(&[2, 2], F), (&[2, 3], F)], |b, x| {
        b.concat(&[x[0], x[1]], 1)
    });
}

#[test]
fn elementwise_gradients_match_finite_differences() {
    check_vjp("add broadcast", &[(&[2, 3, 4], F), (&[4], F)], |b, x| b.add(x[0], x[1]));
    check_vjp("sub broadcast", &[(&[3, 4], F), (&[3, 4], F)], |b, x| b.sub(x[0], x[1]));
    check_vjp("mul broadcast", &[(&[2, 3, 4], F), (&[3, 4], F)], |b, x| {
        b.mul(x[0], x[1])
    });
    check_vjp("scale", &[(&[5], F)], |b, x| b.scale(x[0], -2.5));
    check_vjp("reduce_sum non-contiguous", &[(&[2, 3, 4], F)], |b, x| {
        b.sum(x[0], &[0, 2])
    });
    check_vjp("mean", &[(&[3, 4], F)], |b, x| b.mean(x[0]));
}

#[test]
fn dot_general_gradients_match_finite_differences() {
    check_vjp("matmul", &[(&[2, 3, 4], F), (&[4, 5], F)], |b, x| b.matmul(x[0], x[1]));
    check_vjp("x @ w^T", &[(&[2, 3, 4], F), (&[5, 4], F)], |b, x| {
        b.dot_general(x[0], x[1], (&[2], &[1]), (&[], &[]), 1.0)
    });
    check_vjp(
        "batched attention scores",
        &[(&[2, 2, 3, 4], F), (&[2, 2, 3, 4], F)],
        |b, x| b.dot_general(x[0], x[1], (&[3], &[3]), (&[0, 1], &[0, 1]), 0.5),
    );
    check_vjp("two contracting dims", &[(&[2, 3, 4], F), (&[2, 3, 5], F)], |b, x| {
        b.dot_general(x[0], x[1], (&[0, 1], &[0, 1]), (&[], &[]), 1.0)
    });
    check_vjp("batch dim not leading", &[(&[3, 2, 4], F), (&[4, 2, 5], F)], |b, x| {
        b.dot_general(x[0], x[1], (&[2], &[0]), (&[1], &[1]), 1.0)
    });
}

#[test]
fn transformer_op_gradients_match_finite_differences() {
    check_vjp("gelu", &[(&[3, 5], F)], |b, x| b.gelu(x[0]));
    check_vjp("layer_norm", &[(&[3, 6], F), (&[6], F), (&[6], F)], |b, x| {
        b.layer_norm(x[0], x[1], x[2])
    });
    check_vjp("softmax_causal", &[(&[2, 4, 4], F)], |b, x| b.softmax_causal(x[0]));
    check_vjp("cross_entropy", &[(&[2, 3, 5], F), (&[2, 3], DType::U32)], |b, x| {
        b.cross_entropy(x[0], x[1])
    });
    check_vjp("gather", &[(&[5, 3], F), (&[2, 3], DType::U32)], |b, x| {
        b.take(x[0], x[1])
    });
}

#[test]
fn dropout_gradient_uses_the_forward_mask() {
    check_vjp("dropout", &[(&[4, 8], F), (&[2], DType::U32)], |b, x| {
        b.dropout(x[0], x[1], 0.25, RngLayout::Partitionable)
    });
}

#[test]
fn gradient_of_an_unused_input_is_zero() {
    let mut b = Builder::new();
    let x = b.input("x", &[3], F, Role::Other);
    let y = b.input("y", &[3], F, Role::Other);
    let f = b.sum(x, &[0]);
    let g = grad(&mut b, f, &[x, y]).unwrap();
    b.output(g[1]);
    let prog = b.finish().unwrap();
    let out = ReferenceExecutor::run(&prog, &[Tensor::F32(vec![1.0; 3]), Tensor::F32(vec![2.0; 3])], 1).unwrap();
    assert_eq!(out[0].f32(), &[0.0, 0.0, 0.0]);
    assert!(prog.instrs.iter().any(|i| matches!(i.op, Op::Full { .. })));
}
