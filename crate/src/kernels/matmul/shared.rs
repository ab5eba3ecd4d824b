//! Textures that one program's matmuls share: an operand copied whole into a texture (a copy,
//! `Packing::Copy` or `Packing::KCopy` in variants.rs) holds the same texels wherever the same
//! bytes are copied with the same geometry, so one texture and one copy serve every matmul that
//! reads it. In a train step that is each operand twice: a layer's input X (forward `X @ W`,
//! weight gradient `X^T @ dY`), its weight W (forward, input gradient `dY @ W^T`) and its output
//! gradient dY (input and weight gradients): every pair reads rows of the same floats, once as
//! rows of K and once as k-rows, which are the same texels. On lavapipe at `small` that is 27
//! copies of 54 a step.
//!
//! Sound only for bytes that no dispatch writes between the first copy and the last reader: the
//! caller names such contents (`Sharing::contents`), as the lowering does for the values of a
//! program, each written once by its producer and not again while it is read.
use std::collections::HashMap;
use std::sync::Mutex;

use crate::gpu::{Dispatch, Work};

/// The textures copies made, by what they hold; kept by whoever builds one program's dispatches.
#[derive(Default)]
pub struct SharedTextures {
    made: Mutex<HashMap<Source, (wgpu::TextureView, wgpu::Texture)>>,
}

/// Which matmul operands' bytes may share a texture: `contents[i]` (A, B) names what the
/// operand's memory holds, the same name for the same bytes throughout the dispatches built with
/// `textures`; `None` for memory that changes between readers (scratch).
#[derive(Clone, Copy)]
pub struct Sharing<'a> {
    pub textures: &'a SharedTextures,
    pub contents: [Option<u64>; 2],
}

/// What a copy reads and the texels it fills: equal sources fill equal textures.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Source {
    pub content: u64,
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub bytes_per_row: u32,
    pub width: u32,
    pub rows: u32,
}

impl SharedTextures {
    /// The texture holding `source`: made by `make` the first time it is asked for.
    pub(super) fn get_or_make(
        &self,
        source: Source,
        make: impl FnOnce() -> (wgpu::TextureView, wgpu::Texture),
    ) -> (wgpu::TextureView, wgpu::Texture) {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        made.entry(source).or_insert_with(make).clone()
    }
}

/// `dispatches` without the copies that repeat an earlier one (the same bytes into the same
/// texture), and which dispatches were kept. Every matmul that shares a texture carries its own
/// copy when built, so whichever is built first, the first to run fills it; the rest are dropped
/// here, once the order is final.
// wgpu's resources hash and compare by identity, which their interior state never changes.
#[allow(clippy::mutable_key_type)]
pub fn drop_repeated_copies(dispatches: Vec<Dispatch>) -> (Vec<Dispatch>, Vec<bool>) {
    let mut seen = std::collections::HashSet::new();
    let kept: Vec<bool> = dispatches
        .iter()
        .map(|d| match &d.work {
            Work::CopyToTexture(c) => seen.insert((
                c.texture.clone(),
                c.buffer.clone(),
                c.offset,
                c.bytes_per_row,
                c.width,
                c.rows,
            )),
            Work::Compute { .. } => true,
        })
        .collect();
    let out = dispatches
        .into_iter()
        .zip(&kept)
        .filter(|(_, &k)| k)
        .map(|(d, _)| d)
        .collect();
    (out, kept)
}
