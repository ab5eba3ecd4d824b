//! The Rust Threefry generator against JAX's own answers (tests/fixtures/rng.json, written by
//! tests/golden/make_rng_fixtures.py), and the block properties the sharded modes rely on.
// `&[0..4]` is the one range of a 1-D block, not a mistaken `Vec` of a range.
#![allow(clippy::single_range_in_vec_init)]
use std::ops::Range;

use serde_json::Value;
use shardlab::reference::random::dropout_forward;
use shardlab::rng::{
    bernoulli_keep, keep_prob, random_bits, random_bits_block, threefry2x32, threefry_2x32_counts, uniform, Block, Key,
    RngError, RngLayout,
};

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/rng.json");
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}; run tests/golden/make_rng_fixtures.py"));
    serde_json::from_str(&text).unwrap()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn key(v: &Value) -> Key {
    let k = u32s(v);
    Key([k[0], k[1]])
}

const LAYOUTS: [(&str, RngLayout); 2] = [
    ("original", RngLayout::Original),
    ("partitionable", RngLayout::Partitionable),
];

fn cases<'a>(f: &'a Value, layout: &str, what: &str) -> &'a Vec<Value> {
    f["layouts"][layout][what].as_array().unwrap()
}

#[test]
fn threefry2x32_matches_jax_on_random123_vectors_and_count_arrays() {
    let f = fixture();
    let cases = f["threefry_2x32"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for c in cases {
        let k = u32s(&c["key"]);
        let counts = u32s(&c["counts"]);
        let want = u32s(&c["out"]);
        assert_eq!(
            threefry_2x32_counts([k[0], k[1]], &counts),
            want,
            "key {k:?} counts {counts:?}"
        );
        if counts.len() == 2 {
            assert_eq!(threefry2x32([k[0], k[1]], [counts[0], counts[1]]).to_vec(), want);
        }
    }
    // The Random123 answer for the all-zero key and counter, spelled out.
    assert_eq!(threefry2x32([0, 0], [0, 0]), [0x6b200159, 0x99ba4efe]);
}

#[test]
fn prng_key_from_seed_matches_jax_in_32_and_64_bit_modes() {
    let f = fixture();
    for c in f["prng_key"].as_array().unwrap() {
        let seed = c["seed"].as_i64().unwrap();
        assert_eq!(Key::from_seed(seed), key(&c["key"]), "PRNGKey({seed})");
    }
    for c in f["prng_key_x64"].as_array().unwrap() {
        let seed = c["seed"].as_i64().unwrap();
        assert_eq!(Key::from_seed_x64(seed), key(&c["key"]), "PRNGKey({seed}) with x64");
    }
}

#[test]
fn fold_in_matches_jax() {
    let f = fixture();
    for c in f["fold_in"].as_array().unwrap() {
        let data = c["data"].as_u64().unwrap() as u32;
        assert_eq!(
            key(&c["key"]).fold_in(data),
            key(&c["out"]),
            "fold_in({:?}, {data})",
            c["key"]
        );
    }
}

#[test]
fn split_matches_jax_in_both_layouts() {
    let f = fixture();
    for (name, layout) in LAYOUTS {
        for c in cases(&f, name, "split") {
            let n = c["n"].as_u64().unwrap() as usize;
            let got: Vec<u32> = key(&c["key"]).split(n, layout).iter().flat_map(|k| k.0).collect();
            assert_eq!(got, u32s(&c["keys"]), "{name} split({:?}, {n})", c["key"]);
        }
    }
}

#[test]
fn random_bits_match_jax_in_both_layouts() {
    let f = fixture();
    for (name, layout) in LAYOUTS {
        let cs = cases(&f, name, "bits");
        assert!(cs.len() >= 30);
        for c in cs {
            let shape = usizes(&c["shape"]);
            let got = random_bits(key(&c["key"]), layout, &shape);
            assert_eq!(got, u32s(&c["bits"]), "{name} bits({:?}, {shape:?})", c["key"]);
        }
    }
}

#[test]
fn uniform_matches_jax_bit_for_bit_in_both_layouts() {
    let f = fixture();
    for (name, layout) in LAYOUTS {
        for c in cases(&f, name, "uniform") {
            let shape = usizes(&c["shape"]);
            let got: Vec<u32> = uniform(key(&c["key"]), layout, &shape)
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(
                got,
                u32s(&c["values_bits"]),
                "{name} uniform({:?}, {shape:?})",
                c["key"]
            );
        }
    }
}

#[test]
fn bernoulli_matches_jax_in_both_layouts() {
    let f = fixture();
    for (name, layout) in LAYOUTS {
        for c in cases(&f, name, "bernoulli") {
            let shape = usizes(&c["shape"]);
            let p = c["p"].as_f64().unwrap() as f32;
            let got: Vec<u32> = bernoulli_keep(key(&c["key"]), layout, &shape, p)
                .iter()
                .map(|&b| b as u32)
                .collect();
            assert_eq!(
                got,
                u32s(&c["keep"]),
                "{name} bernoulli({:?}, {p}, {shape:?})",
                c["key"]
            );
        }
    }
}

#[test]
fn reference_dropout_matches_flax_style_jax_dropout_bit_for_bit() {
    let f = fixture();
    for (name, layout) in LAYOUTS {
        for c in cases(&f, name, "dropout") {
            let shape = usizes(&c["shape"]);
            let rate = c["rate"].as_f64().unwrap() as f32;
            let x: Vec<f32> = u32s(&c["x_bits"]).into_iter().map(f32::from_bits).collect();
            let y = dropout_forward(&x, key(&c["key"]), layout, &Block::full(&shape), rate).unwrap();
            let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, u32s(&c["y_bits"]), "{name} dropout rate {rate} shape {shape:?}");
        }
    }
}

/// Every block of a grid that cuts each dim of `shape` into `parts[d]` equal pieces.
fn grid(shape: &[usize], parts: &[usize]) -> Vec<Block> {
    let mut blocks = vec![Vec::<Range<usize>>::new()];
    for (&n, &p) in shape.iter().zip(parts) {
        let step = n / p;
        blocks = blocks
            .into_iter()
            .flat_map(|b| {
                (0..p).map(move |i| {
                    let mut b = b.clone();
                    b.push(i * step..(i + 1) * step);
                    b
                })
            })
            .collect();
    }
    blocks.iter().map(|r| Block::new(shape, r).unwrap()).collect()
}

#[test]
fn partitionable_blocks_computed_alone_tile_the_global_bits() {
    let k = Key::from_seed(3).fold_in(11);
    for (shape, parts) in [
        (vec![12], vec![4]),
        (vec![4, 6, 10], vec![2, 3, 2]),
        (vec![2, 3, 4, 6], vec![1, 3, 2, 3]),
    ] {
        let global = random_bits(k, RngLayout::Partitionable, &shape);
        let mut stitched = vec![None; global.len()];
        for b in grid(&shape, &parts) {
            let local = random_bits_block(k, RngLayout::Partitionable, &b);
            assert_eq!(local.len(), b.numel());
            for (g, v) in b.global_indices().zip(local) {
                assert!(stitched[g as usize].replace(v).is_none(), "blocks overlap at {g}");
            }
        }
        let stitched: Vec<u32> = stitched
            .into_iter()
            .map(|v| v.expect("blocks cover the array"))
            .collect();
        assert_eq!(stitched, global, "shape {shape:?} parts {parts:?}");
    }
}

#[test]
fn original_layout_block_equals_the_slice_of_the_global_bits() {
    let k = Key::from_seed(5);
    for (shape, parts) in [
        (vec![7], vec![7]),
        (vec![4, 6, 5], vec![2, 3, 1]),
        (vec![3, 5], vec![3, 5]),
    ] {
        let global = random_bits(k, RngLayout::Original, &shape);
        for b in grid(&shape, &parts) {
            let sliced: Vec<u32> = b.global_indices().map(|g| global[g as usize]).collect();
            assert_eq!(
                random_bits_block(k, RngLayout::Original, &b),
                sliced,
                "block {:?}",
                b.start()
            );
        }
    }
}

#[test]
fn only_partitionable_bits_are_independent_of_the_global_size() {
    // An element's bits in the partitionable layout depend on its index alone; in the
    // original layout they change with the global size, so a local-shape draw cannot
    // reproduce a block of the global one.
    let k = Key::from_seed(0);
    let small = random_bits(k, RngLayout::Partitionable, &[8]);
    assert_eq!(small, random_bits(k, RngLayout::Partitionable, &[16])[..8]);
    let small = random_bits(k, RngLayout::Original, &[8]);
    let big = random_bits(k, RngLayout::Original, &[16]);
    assert!(small.iter().zip(&big).all(|(a, b)| a != b));
}

#[test]
fn bad_blocks_and_rates_are_errors_that_say_what_to_fix() {
    let e = Block::new(&[4, 5], &[0..2]).unwrap_err();
    assert!(
        matches!(e, RngError::Block(ref m) if m.contains("one range per dim")),
        "{e}"
    );
    let e = Block::new(&[4, 5], &[0..2, 3..6]).unwrap_err();
    assert!(e.to_string().contains("3..6"), "{e}");
    assert_eq!(keep_prob(1.5), Err(RngError::Rate(1.5)));
    assert!(keep_prob(f32::NAN).is_err());
    assert_eq!(keep_prob(0.0), Ok(1.0));
    let e = dropout_forward(
        &[1.0; 3],
        Key::from_seed(0),
        RngLayout::Original,
        &Block::full(&[4]),
        0.5,
    )
    .unwrap_err();
    assert!(e.to_string().contains("3 elements"), "{e}");
}
