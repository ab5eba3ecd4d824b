//! Launchers of shaders/random.wgsl: JAX-exact Threefry random bits and dropout.
//!
//! One launch covers every simulated device: `blocks[d]` is the block of the global array
//! that device d makes, written to elements `d * n_block ..` of the output (`[device, local]`).
//! * partitionable layout, sharded: each device's own block;
//! * original layout, as JAX's partitioner runs it: every block is `Block::full` (each device
//!   makes the whole global array), then the executor slices;
//! * one device: `&[Block::full(shape)]`.
//!
//! The key is a small storage buffer (2 words, or 2 per device with [`KeyMode::PerDevice`],
//! e.g. `fold_in(key, axis_index)` in shard_map) that the host rewrites every step with
//! `ctx.write`, so a [`Dispatch`] is built once and replayed.
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
use crate::rng::{keep_prob, keep_scale, Block, RngLayout};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n_global: u32,
    n_block: u32,
    n_dev: u32,
    rng_layout: u32,
    keep: f32,
    key_stride: u32,
    scale: f32,
    pad: u32,
    block_size: [u32; 4],
    global_stride: [u32; 4],
}

/// Whether all devices of a launch share one key or each has its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyMode {
    /// `key` holds one pair `[k0, k1]` used by every device.
    Shared,
    /// `key` holds `[device, 2]`: device d uses `key[2d], key[2d + 1]`.
    PerDevice,
}

/// Canonical rank-4 form of equal-size blocks: merged dims, strides, and per-device starts.
struct Canonical {
    n_global: u32,
    n_block: u32,
    block_size: [u32; 4],
    global_stride: [u32; 4],
    offsets: Vec<u32>, // (n_dev, 4)
}

/// The largest global array a launch can index with 32-bit counters (JAX's original layout
/// also changes its scheme from 2^32 - 1 elements on).
const MAX_GLOBAL: u64 = u32::MAX as u64 - 1;

fn canonicalize(what: &str, blocks: &[Block]) -> Result<Canonical, GpuError> {
    let first = blocks
        .first()
        .ok_or_else(|| GpuError::Invalid(format!("{what}: no blocks given; give one block per device")))?;
    for (d, b) in blocks.iter().enumerate() {
        if b.global_shape() != first.global_shape() || b.size() != first.size() {
            return Err(GpuError::Invalid(format!(
                "{what}: block {d} is {:?} of global {:?}, block 0 is {:?} of {:?}; all devices need equal blocks",
                b.size(),
                b.global_shape(),
                first.size(),
                first.global_shape()
            )));
        }
    }
    let n_global = first.global_numel();
    if n_global > MAX_GLOBAL {
        return Err(GpuError::Invalid(format!(
            "{what}: global array of {n_global} elements; the GPU generator supports at most {MAX_GLOBAL}"
        )));
    }
    let n_block = first.numel();
    if (n_block as u64) * (blocks.len() as u64) > u32::MAX as u64 {
        return Err(GpuError::Invalid(format!(
            "{what}: {} devices x {n_block} elements exceed 2^32 invocations; split the launch",
            blocks.len()
        )));
    }
    // Merge each dim into the one outside it while it is whole (saves index arithmetic and
    // brings any rank down to at most 4 when blocks cut few dims).
    let mut global: Vec<u64> = Vec::new();
    let mut size: Vec<u64> = Vec::new();
    let mut starts: Vec<Vec<u64>> = vec![Vec::new(); blocks.len()];
    for dim in 0..first.global_shape().len() {
        let g = first.global_shape()[dim] as u64;
        let s = first.size()[dim] as u64;
        let whole = s == g;
        if whole && !global.is_empty() {
            let last = global.len() - 1;
            global[last] *= g;
            size[last] *= g;
            for (st, b) in starts.iter_mut().zip(blocks) {
                st[last] = st[last] * g + b.start()[dim] as u64;
            }
        } else {
            global.push(g);
            size.push(s);
            for (st, b) in starts.iter_mut().zip(blocks) {
                st.push(b.start()[dim] as u64);
            }
        }
    }
    if global.len() > 4 {
        return Err(GpuError::Invalid(format!(
            "{what}: blocks {:?} of {:?} cut {} dims; the kernel handles blocks cutting at most 4",
            first.size(),
            first.global_shape(),
            global.len()
        )));
    }
    let pad = 4 - global.len();
    let mut block_size = [1u32; 4];
    let mut global_shape = [1u64; 4];
    for d in 0..global.len() {
        block_size[pad + d] = size[d] as u32;
        global_shape[pad + d] = global[d];
    }
    let mut global_stride = [1u32; 4];
    for d in (0..3).rev() {
        global_stride[d] = global_stride[d + 1] * global_shape[d + 1] as u32;
    }
    let mut offsets = vec![0u32; 4 * blocks.len()];
    for (dev, st) in starts.iter().enumerate() {
        for d in 0..st.len() {
            offsets[4 * dev + pad + d] = st[d] as u32;
        }
    }
    Ok(Canonical {
        n_global: n_global as u32,
        n_block: n_block as u32,
        block_size,
        global_stride,
        offsets,
    })
}

fn check_len(what: &str, buf: &GpuBuffer, need: usize) -> Result<(), GpuError> {
    if buf.len < need {
        return Err(GpuError::Invalid(format!(
            "{what}: buffer `{}` holds {} elements, the launch needs {need}",
            buf.name, buf.len
        )));
    }
    Ok(())
}

/// What a launch draws: the layout of the global array, each device's block of it, and whether
/// the devices share one key.
#[derive(Clone, Copy, Debug)]
pub struct Draw<'a> {
    pub layout: RngLayout,
    /// `blocks[d]`: the block of the global array that device d makes.
    pub blocks: &'a [Block],
    pub keys: KeyMode,
}

/// A draw as a kernel reads it: the counters' layout, the key stride, the canonical rank-4 block
/// and global strides, and each device's block start `(n_dev, 4)`. The bits kernels and fused
/// attention (which draws its dropout bits in place) share it, so both make the same bits.
pub struct Counters {
    pub n_global: u32,
    pub n_block: u32,
    pub rng_layout: u32,
    pub key_stride: u32,
    pub block_size: [u32; 4],
    pub global_stride: [u32; 4],
    pub offsets: Vec<u32>,
}

/// The counters of `draw`, with `key` checked to hold every device's key.
pub fn counters(what: &str, key: &GpuBuffer, draw: &Draw<'_>) -> Result<Counters, GpuError> {
    let c = canonicalize(what, draw.blocks)?;
    let n_dev = draw.blocks.len();
    let key_stride = match draw.keys {
        KeyMode::Shared => 0,
        KeyMode::PerDevice => 2,
    };
    check_len(what, key, if key_stride == 0 { 2 } else { 2 * n_dev })?;
    Ok(Counters {
        n_global: c.n_global,
        n_block: c.n_block,
        rng_layout: match draw.layout {
            RngLayout::Original => 0,
            RngLayout::Partitionable => 1,
        },
        key_stride,
        block_size: c.block_size,
        global_stride: c.global_stride,
        offsets: c.offsets,
    })
}

/// Builds one launch of `entry` from `kernel`, which holds the bindings besides key, offsets
/// and params; `io` are those bindings' buffers, each (n_dev, n_block).
async fn launch(
    ctx: &GpuContext,
    kernel: Kernel<'_>,
    key: &GpuBuffer,
    io: &[&GpuBuffer],
    draw: &Draw<'_>,
    keep: f32,
) -> Result<Dispatch, GpuError> {
    let entry = kernel.entry.clone();
    let c = counters(&entry, key, draw)?;
    let n_dev = draw.blocks.len();
    for b in io {
        check_len(&entry, b, n_dev * c.n_block as usize)?;
    }
    let params = Params {
        n_global: c.n_global,
        n_block: c.n_block,
        n_dev: n_dev as u32,
        rng_layout: c.rng_layout,
        keep,
        key_stride: c.key_stride,
        scale: keep_scale(keep),
        pad: 0,
        block_size: c.block_size,
        global_stride: c.global_stride,
    };
    // Original-layout bits of the whole array on every device (automatic mode's replicated
    // generation): one invocation per counter pair writes both words of its hash, as XLA hashes
    // each pair once, where `random_bits` would hash it once per element.
    let whole = c.n_block == c.n_global && c.offsets.iter().all(|&o| o == 0);
    let pairs = entry == "random_bits" && draw.layout == RngLayout::Original && whole;
    let invocations = if pairs {
        n_dev * (c.n_global as usize).div_ceil(2)
    } else {
        n_dev * c.n_block as usize
    };
    let label = format!("{entry} {:?} {n_dev}x{}", draw.layout, c.n_block);
    let mut kernel = kernel
        .read(0, "key", key)
        .uniform(5, &params)
        .grid(grid_1d(invocations, 256));
    if pairs {
        // Its blocks all start at 0: no offsets to read.
        kernel.entry = "random_bits_pairs".to_string();
    } else {
        kernel = kernel.read_owned(4, "offsets", ctx.upload(&format!("{label} offsets"), &c.offsets)?);
    }
    kernel.label = label;
    ctx.launch(kernel).await
}

/// `bits[d] = jax.random.bits(key, global_shape, uint32)[blocks[d]]`, bits `(n_dev, n_block)` u32.
pub async fn random_bits(
    ctx: &GpuContext,
    key: &GpuBuffer,
    bits: &GpuBuffer,
    draw: &Draw<'_>,
) -> Result<Dispatch, GpuError> {
    let kernel = Kernel::new("random", "random_bits", "").write(2, "bits", bits);
    launch(ctx, kernel, key, &[bits], draw, 1.0).await
}

fn dropout_keep(what: &str, rate: f32) -> Result<f32, GpuError> {
    keep_prob(rate).map_err(|e| GpuError::Invalid(format!("{what}: {e}")))
}

/// `out = keep ? x * (1 / (1 - rate)) : 0`, keep = `bernoulli(key, 1 - rate, global_shape)[block]`
/// exactly as JAX draws it in `layout`: flax's Dropout bit for bit (its `x / keep_prob` is a
/// multiplication by the reciprocal once XLA compiles it). x, out: `(n_dev, n_block)`.
pub async fn dropout_forward(
    ctx: &GpuContext,
    x: &GpuBuffer,
    key: &GpuBuffer,
    out: &GpuBuffer,
    draw: &Draw<'_>,
    rate: f32,
) -> Result<Dispatch, GpuError> {
    let keep = dropout_keep("dropout_forward", rate)?;
    let kernel = Kernel::new("random", "dropout_forward", "")
        .read(1, "x", x)
        .write(3, "out", out);
    launch(ctx, kernel, key, &[x, out], draw, keep).await
}

/// `dx = keep ? dout * (1 / (1 - rate)) : 0`, regenerating the forward's mask from the same key
/// (no mask is stored). dout, dx: `(n_dev, n_block)`.
pub async fn dropout_backward(
    ctx: &GpuContext,
    dout: &GpuBuffer,
    key: &GpuBuffer,
    dx: &GpuBuffer,
    draw: &Draw<'_>,
    rate: f32,
) -> Result<Dispatch, GpuError> {
    let keep = dropout_keep("dropout_backward", rate)?;
    let kernel = Kernel::new("random", "dropout_backward", "")
        .read(1, "dout", dout)
        .write(3, "dx", dx);
    launch(ctx, kernel, key, &[dout, dx], draw, keep).await
}

/// `out[d] = jax.random.fold_in(key[d], data[d])` for each of `data.len()` devices: keys
/// `(n_dev, 2)` u32 (`KeyMode::Shared`: every device folds the one key).
pub async fn fold_in(
    ctx: &GpuContext,
    key: &GpuBuffer,
    out: &GpuBuffer,
    data: &[u32],
    keys: KeyMode,
) -> Result<Dispatch, GpuError> {
    let n_dev = data.len();
    let key_stride = match keys {
        KeyMode::Shared => 0,
        KeyMode::PerDevice => 2,
    };
    check_len("fold_in", key, if key_stride == 0 { 2 } else { 2 * n_dev })?;
    check_len("fold_in", out, 2 * n_dev)?;
    let label = format!("fold_in {n_dev}x{data:?}");
    let params = Params {
        n_global: 0,
        n_block: 0,
        n_dev: n_dev as u32,
        rng_layout: 0,
        keep: 1.0,
        key_stride,
        scale: 1.0,
        pad: 0,
        block_size: [0; 4],
        global_stride: [0; 4],
    };
    let data = ctx.upload(&format!("{label} data"), data)?;
    let kernel = Kernel::new("random", "fold_in", label)
        .read(0, "key", key)
        .write(2, "out", out)
        .read_owned(4, "data", data)
        .uniform(5, &params)
        .grid(grid_1d(n_dev, 64));
    ctx.launch(kernel).await
}
