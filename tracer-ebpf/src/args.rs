//! USDT argument decoding: a `UsdtArg` spec (constant, register, or memory at a register
//! plus an offset and an optional scaled index register) read at the probe and widened to
//! 64 bits. Two forms: [`read_arg`] for one argument (a task id), failures counted at
//! once; [`Registers`] with [`decode_arg`] for every argument of an event, with few
//! branches and failures returned to be counted once.

use core::mem::MaybeUninit;

use aya_ebpf::{
    EbpfContext as _,
    bindings::pt_regs,
    cty::c_void,
    helpers::{
        bpf_probe_read_kernel,
        generated::{
            bpf_probe_read_kernel as bpf_probe_read_kernel_raw,
            bpf_probe_read_user as bpf_probe_read_user_raw, bpf_probe_read_user_str,
        },
    },
    programs::ProbeContext,
};
use tracer_common::{UsdtArg, arg_kind, counter};

use crate::count;

/// The user registers at the probe, copied once so an argument's register is a stack
/// read at a computed index instead of a helper call per register.
pub struct Registers {
    /// Written whole by the helper (zeroed on failure), so never left uninitialized; not
    /// zeroed beforehand, which the compiler would do with a loop the verifier walks.
    slots: MaybeUninit<[u64; REGISTER_SLOTS]>,
    /// Negative when the copy failed (the registers then read as 0).
    pub failure: i64,
}

const REGISTER_SLOTS: usize = core::mem::size_of::<pt_regs>() / 8;

impl Registers {
    #[inline(always)]
    pub fn snapshot(ctx: &ProbeContext) -> Self {
        let mut slots = MaybeUninit::<[u64; REGISTER_SLOTS]>::uninit();
        // SAFETY: the destination is a stack buffer the size of pt_regs; the helper checks
        // the source (and zeroes the destination on failure).
        let failure = unsafe {
            bpf_probe_read_kernel_raw(
                slots.as_mut_ptr().cast::<c_void>(),
                core::mem::size_of::<pt_regs>() as u32,
                ctx.as_ptr().cast_const(),
            )
        };
        Registers { slots, failure }
    }

    /// The register at byte offset `reg_off` of `pt_regs`.
    #[inline(always)]
    fn get(&self, reg_off: u8) -> u64 {
        // SAFETY: the helper wrote every slot (see `slots`).
        let slots = unsafe { self.slots.assume_init_ref() };
        slots.get(reg_off as usize / 8).copied().unwrap_or(0)
    }
}

/// [`read_arg`] for events, with few branches: the index term is computed for every
/// memory operand (`scale` is 0 unless the spec is indexed), user memory is read with
/// one helper call whatever its size, and a failure is returned, not counted.
#[inline(always)]
pub fn decode_arg(regs: &Registers, arg: &UsdtArg) -> (u64, i64) {
    let base = regs.get(arg.reg_off);
    let (raw, failure) = match arg.kind {
        arg_kind::CONST => (arg.val_off as u64, 0),
        arg_kind::REG => (base, 0),
        arg_kind::REG_DEREF | arg_kind::REG_DEREF_INDEXED => {
            let index = regs.get(arg.idx_reg_off).wrapping_mul(u64::from(arg.scale));
            let addr = base.wrapping_add(index).wrapping_add(arg.val_off as u64);
            read_user_raw(addr, arg.size)
        }
        _ => (0, 0),
    };
    (widen_branchless(raw, arg.size, arg.signed), failure)
}

/// Reads exactly `size` bytes (1 to 8) of user memory, so a value at the end of a page
/// is fine, with one helper call whatever the size (little-endian: the low bytes come
/// first). The value is 0 when the read fails (the helper zeroes it), with the failure.
#[inline(always)]
fn read_user_raw(addr: u64, size: u8) -> (u64, i64) {
    let mut value = 0u64;
    let len = u32::from(size.wrapping_sub(1) & 7) + 1;
    // SAFETY: `len` is at most 8, the size of `value`; the helper validates the user
    // address and reports faults.
    let failure =
        unsafe { bpf_probe_read_user_raw((&raw mut value).cast(), len, addr as *const c_void) };
    (value, failure)
}

/// Copies the NUL-terminated string at user address `addr` into `dst`, at most `size`
/// bytes with the NUL (always written): the bytes copied, or a negative errno for a
/// NULL or unmapped pointer.
///
/// # Safety
/// `dst` must be valid for `size` bytes of writes.
#[inline(always)]
pub unsafe fn read_user_str(dst: *mut u8, size: u32, addr: u64) -> i64 {
    // SAFETY: the caller vouches for `dst`; the helper validates the user address.
    unsafe { bpf_probe_read_user_str(dst.cast::<c_void>(), size, addr as *const c_void) }
}

/// [`widen`] without a branch: sign extension as `(x ^ m) - m`, `m` the sign bit when
/// signed and 0 when not.
#[inline(always)]
fn widen_branchless(raw: u64, size: u8, signed: u8) -> u64 {
    let bits = 8 * (u32::from(size.wrapping_sub(1) & 7) + 1);
    let low = raw & (u64::MAX >> (64 - bits));
    let sign = u64::from(signed & 1) << (bits - 1);
    (low ^ sign).wrapping_sub(sign)
}

/// Decodes one argument as the spec says, widened to 64 bits.
#[inline(always)]
pub fn read_arg(ctx: &ProbeContext, arg: &UsdtArg) -> u64 {
    let raw = match arg.kind {
        arg_kind::CONST => arg.val_off as u64,
        arg_kind::REG => register(ctx, arg.reg_off),
        arg_kind::REG_DEREF => {
            let addr = register(ctx, arg.reg_off).wrapping_add(arg.val_off as u64);
            read_user(addr, arg.size)
        }
        arg_kind::REG_DEREF_INDEXED => {
            let index = register(ctx, arg.idx_reg_off).wrapping_mul(u64::from(arg.scale));
            let addr = register(ctx, arg.reg_off)
                .wrapping_add(index)
                .wrapping_add(arg.val_off as u64);
            read_user(addr, arg.size)
        }
        _ => 0,
    };
    widen(raw, arg.size, arg.signed != 0)
}

/// Reads a saved user register from `pt_regs`. The offset is data, and context loads
/// must use constant offsets, so this goes through `bpf_probe_read_kernel`.
#[inline(always)]
fn register(ctx: &ProbeContext, reg_off: u8) -> u64 {
    let addr = (ctx.as_ptr() as *const u8)
        .wrapping_add(reg_off as usize)
        .cast::<u64>();
    // SAFETY: the helper checks the address; a failure yields 0 and is counted.
    unsafe { bpf_probe_read_kernel(addr) }.unwrap_or_else(|_| {
        count(counter::ARG_READ_ERRORS);
        0
    })
}

/// Reads exactly `size` bytes of user memory, so a value at the end of a page is fine.
#[inline(always)]
fn read_user(addr: u64, size: u8) -> u64 {
    let (value, failure) = read_user_raw(addr, size);
    if failure != 0 {
        count(counter::ARG_READ_ERRORS);
    }
    value
}

/// Keeps the low `size` bytes, sign-extending when the spec says signed.
#[inline(always)]
fn widen(raw: u64, size: u8, signed: bool) -> u64 {
    let shift = 64 - 8 * u32::from(size.clamp(1, 8));
    if signed {
        (((raw << shift) as i64) >> shift) as u64
    } else {
        (raw << shift) >> shift
    }
}
