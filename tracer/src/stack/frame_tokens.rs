//! Frames that stand for no machine address (a Python function at a line), carried
//! through the address-based stack pipeline as tokens: values that no user or kernel
//! address can have. Whoever makes such a frame gives it a name and a module here
//! ([`token`]); naming a stack asks here first ([`frame`]).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

/// The bits that mark a token: non-canonical on x86-64, so neither a user nor a kernel
/// address.
const TAG: u64 = 0x4000_0000_0000_0000;
const TAG_MASK: u64 = 0xC000_0000_0000_0000;
/// Tokens are `TAG | id << 4 | 8`, so the return-address lookup (one byte less) still
/// decodes to the same id.
const SHIFT: u32 = 4;

/// Every (name, module) given a token, in token order.
#[derive(Default)]
struct Table {
    frames: Vec<(String, &'static str)>,
    ids: HashMap<(String, &'static str), u64>,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(Default::default);

/// Whether `addr` (or that address less one) is a token.
pub(crate) fn is_token(addr: u64) -> bool {
    addr & TAG_MASK == TAG
}

/// The token of the frame `name` in `module`, the same for the same pair.
pub(crate) fn token(name: String, module: &'static str) -> u64 {
    let Ok(mut table) = TABLE.lock() else {
        return 0;
    };
    let key = (name, module);
    if let Some(&token) = table.ids.get(&key) {
        return token;
    }
    let token = TAG | ((table.frames.len() as u64) << SHIFT) | 8;
    table.frames.push(key.clone());
    table.ids.insert(key, token);
    token
}

/// The name and module of the frame `addr` stands for, if it is a token.
pub(crate) fn frame(addr: u64) -> Option<(String, &'static str)> {
    if !is_token(addr) {
        return None;
    }
    let id = ((addr & !TAG) >> SHIFT) as usize;
    TABLE.lock().ok()?.frames.get(id).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_neither_user_nor_kernel_addresses_and_survive_the_lookup() {
        let t = token("f (x.py:3)".to_string(), "[python]");
        assert!(is_token(t) && is_token(t - 1));
        assert_eq!(frame(t), Some(("f (x.py:3)".to_string(), "[python]")));
        assert_eq!(frame(t - 1), frame(t));
        assert_eq!(token("f (x.py:3)".to_string(), "[python]"), t);
        assert!(!is_token(0x7fff_ffff_f000) && !is_token(0xffff_ffff_8100_0000));
        assert_eq!(frame(0x40_0000), None);
    }
}
