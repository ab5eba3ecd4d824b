//! Reading a small text file a user names (`--text`, `--spec-file`) without trusting it.
use std::io::Read;

use super::ModelError;
use crate::setting::{Refusal, Setting};

/// The most bytes `--text` reads: a character-level corpus for a small model.
pub const MAX_TEXT_BYTES: u64 = 64 << 20;

/// Reads the UTF-8 text file `path` given as `setting`. Only a regular file is opened (a FIFO
/// would block on open, and /dev/zero never ends), of at most `max_bytes`; a leading UTF-8
/// byte-order mark is dropped, so it cannot become part of the first name or character.
pub fn read_text_file(setting: Setting, path: &str, max_bytes: u64) -> Result<String, ModelError> {
    let refuse = |why: String| ModelError::from(Refusal::at(setting.clone(), path, why));
    let cannot = |e: std::io::Error| {
        ModelError::from(Refusal::new(
            setting.clone(),
            format!("cannot read {}: {e}", setting.at(path)),
        ))
    };
    let meta = std::fs::metadata(path).map_err(cannot)?;
    if !meta.is_file() {
        return Err(refuse(
            "is not a regular file (a directory, device or pipe): give a text file".into(),
        ));
    }
    let too_large = || refuse(format!("is larger than {max_bytes} bytes: give a smaller file"));
    if meta.len() > max_bytes {
        return Err(too_large());
    }
    // The file may grow between the check and the read: read one byte past the cap at most.
    let mut bytes = vec![];
    std::fs::File::open(path)
        .map_err(cannot)?
        .take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large());
    }
    if bytes.contains(&0) {
        return Err(refuse("looks binary (it has NUL bytes): give a UTF-8 text file".into()));
    }
    let text =
        String::from_utf8(bytes).map_err(|e| refuse(format!("is not valid UTF-8 ({e}): give a UTF-8 text file")))?;
    Ok(match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_string(),
        None => text,
    })
}
