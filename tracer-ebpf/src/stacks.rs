//! Stack ids in `STACKS`, taken the same way by every program.

use aya_ebpf::{bindings::BPF_F_USER_STACK, programs::tracing::StackIdContext};
use aya_log_ebpf::debug;
use tracer_common::{NO_STACK, counter};

use crate::{STACKS, count};

/// `bpf_get_stackid`'s errors: another stack in the slot, no room left.
const EEXIST: i32 = -17;
const ENOMEM: i32 = -12;

/// The id in `STACKS` of the current user (`BPF_F_USER_STACK`) or kernel (`0`) stack,
/// [`NO_STACK`] when there is none to take (a kernel thread has no user stack, a sample
/// in user mode no kernel stack): not an error. Any other error is counted in
/// `counter::STACK_ERRORS` and returned as the id (negative, so never a key of `STACKS`).
#[inline(always)]
pub fn stack_id<C: StackIdContext>(ctx: &C, flags: u64) -> i32 {
    match ctx.get_stackid(&STACKS, flags) {
        Ok(id) => id as i32,
        Err(NO_STACK) => NO_STACK,
        Err(err) => {
            count(counter::STACK_ERRORS);
            match err {
                EEXIST => count(counter::STACK_COLLISIONS),
                ENOMEM => count(counter::STACK_MAP_FULL),
                _ => {}
            }
            let which = if flags & u64::from(BPF_F_USER_STACK) != 0 {
                "user"
            } else {
                "kernel"
            };
            debug!(ctx, "{} stack capture failed: error {}", which, err);
            err
        }
    }
}
