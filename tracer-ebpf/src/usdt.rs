//! USDT probe hits: hit counts, per-thread latencies, and argument decoding for events.

use core::mem::MaybeUninit;

use aya_ebpf::{
    EbpfContext as _,
    bindings::pt_regs,
    cty::c_void,
    helpers::{
        bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::{
            bpf_get_attach_cookie, bpf_probe_read_kernel as bpf_probe_read_kernel_raw,
            bpf_probe_read_user as bpf_probe_read_user_raw,
        },
    },
    programs::ProbeContext,
};
use tracer_common::{
    LatencyProcessKey, LatencyStartKey, LatencyStats, MAX_LATENCIES, MAX_LATENCIES_PER_PROBE,
    MAX_USDT_ARGS, UsdtArg, UsdtEvent, UsdtSite, arg_kind, counter, histogram, site_flags,
    target_filter,
};

use crate::{
    LATENCY_BY_PROCESS, LATENCY_HIST, LATENCY_STARTS, LATENCY_STATS, PROBE_HITS, USDT_EVENTS,
    USDT_SPECS, count, count_by,
};

/// The site whose uprobe fired, found through the link's BPF cookie, counted as a hit,
/// and the `tgid << 32 | tid` of the thread that hit it (see `targets::current_ids`).
#[inline(always)]
fn hit_site(ctx: &ProbeContext) -> Option<(&'static UsdtSite, u64)> {
    if crate::stopped() {
        return None;
    }
    let pid_tgid = crate::targets::current_pid_tgid();
    // 0: a task outside the tracer's PID namespace.
    if pid_tgid == 0 || !crate::targets::is_traced((pid_tgid >> 32) as u32, target_filter::USDT) {
        return None;
    }
    // SAFETY: the helper only reads the cookie of the link that ran this program.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let site = USDT_SPECS.get(cookie)?;
    if let Some(hits) = PROBE_HITS.get_ptr_mut(site.probe_id) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        let hits = unsafe { &mut *hits };
        if hits.count == 0 {
            // SAFETY: the helper has no preconditions.
            hits.first_ns = unsafe { bpf_ktime_get_ns() };
        }
        hits.count += 1;
    }
    Some((site, pid_tgid))
}

/// Counting, latencies and, with `TASKS`, task switches: no argument decoding but a task
/// id's.
#[inline(always)]
pub fn on_hit<const TASKS: bool>(ctx: &ProbeContext) {
    let Some((site, pid_tgid)) = hit_site(ctx) else {
        return;
    };
    let task_flags = site_flags::TASK_RUN | site_flags::TASK_PAUSE | site_flags::TASK_FINISH;
    let task_switch = TASKS && site.flags & task_flags != 0;
    if site.latency_begin_count == 0 && site.latency_end_count == 0 && !task_switch {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let tid = pid_tgid as u32;
    end_latencies(site, (pid_tgid >> 32) as u32, tid, now);
    begin_latencies(site, tid, now);
    if task_switch {
        crate::tasks::on_task_probe(ctx, site, pid_tgid, now);
    }
}

/// Every hit with its decoded arguments, through the ring buffer (`tracer trace`).
#[inline(always)]
pub fn on_hit_with_event<const MAX_ARGS: usize>(ctx: &ProbeContext) {
    let Some((site, pid_tgid)) = hit_site(ctx) else {
        return;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    emit_event::<MAX_ARGS>(ctx, site, pid_tgid, now);
}

#[inline(always)]
fn begin_latencies(site: &UsdtSite, tid: u32, now: u64) {
    for i in 0..MAX_LATENCIES_PER_PROBE {
        if i >= site.latency_begin_count as usize {
            break;
        }
        let key = LatencyStartKey {
            tid,
            latency_id: site.latency_begins[i],
        };
        if LATENCY_STARTS.insert(&key, &now, 0).is_err() {
            count(counter::MAP_FULL);
        }
    }
}

#[inline(always)]
fn end_latencies(site: &UsdtSite, tgid: u32, tid: u32, now: u64) {
    for i in 0..MAX_LATENCIES_PER_PROBE {
        if i >= site.latency_end_count as usize {
            break;
        }
        let latency_id = site.latency_ends[i];
        let key = LatencyStartKey { tid, latency_id };
        // SAFETY: the value is copied out before the entry is removed.
        match unsafe { LATENCY_STARTS.get(&key) } {
            Some(&start) => {
                let _ = LATENCY_STARTS.remove(&key);
                record_latency(latency_id, tgid, now.saturating_sub(start));
            }
            None => count(counter::UNMATCHED_ENDS),
        }
    }
}

#[inline(always)]
fn record_latency(latency_id: u32, tgid: u32, ns: u64) {
    if latency_id >= MAX_LATENCIES {
        return;
    }
    let bucket = latency_id * histogram::BUCKETS + histogram::bucket_of(ns);
    if let Some(slot) = LATENCY_HIST.get_ptr_mut(bucket) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
    if let Some(stats) = LATENCY_STATS.get_ptr_mut(latency_id) {
        // SAFETY: as above.
        add_to(unsafe { &mut *stats }, ns);
    }
    let key = LatencyProcessKey { tgid, latency_id };
    match LATENCY_BY_PROCESS.get_ptr_mut(&key) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU.
        Some(stats) => add_to(unsafe { &mut *stats }, ns),
        None => {
            let stats = LatencyStats {
                count: 1,
                total_ns: ns,
                min_ns: ns,
                max_ns: ns,
            };
            if LATENCY_BY_PROCESS.insert(&key, &stats, 0).is_err() {
                count(counter::MAP_FULL);
            }
        }
    }
}

#[inline(always)]
fn add_to(stats: &mut LatencyStats, ns: u64) {
    if stats.count == 0 || ns < stats.min_ns {
        stats.min_ns = ns;
    }
    if ns > stats.max_ns {
        stats.max_ns = ns;
    }
    stats.count += 1;
    stats.total_ns += ns;
}

#[inline(always)]
/// Decodes at most `MAX_ARGS` arguments: the verifier walks each one, so sites with few
/// arguments get a program that is quicker to verify.
fn emit_event<const MAX_ARGS: usize>(ctx: &ProbeContext, site: &UsdtSite, pid_tgid: u64, now: u64) {
    let Some(mut entry) = USDT_EVENTS.reserve::<UsdtEvent>(0) else {
        count(counter::EVENTS_LOST);
        return;
    };
    let event = entry.as_mut_ptr();
    let arg_count = (site.arg_count as usize).min(MAX_ARGS).min(MAX_USDT_ARGS);
    let regs = Registers::snapshot(ctx);
    // Read failures (negative helper results) are OR-ed together and counted once, without
    // a branch: branches on them would multiply the paths the verifier walks, and so its
    // time at launch.
    let mut failures = regs.failure;
    // SAFETY: `event` points at a reserved, writable ring buffer slot of the right size;
    // every field is written before submit.
    unsafe {
        (*event).ts_ns = now;
        (*event).pid = (pid_tgid >> 32) as u32;
        (*event).tid = pid_tgid as u32;
        (*event).probe_id = site.probe_id;
        (*event).arg_count = arg_count as u32;
        // Volatile stores, so the compiler does not turn them into a call to a memset loop
        // that the verifier would walk byte by byte.
        for i in 0..MAX_USDT_ARGS {
            core::ptr::write_volatile(&mut (*event).args[i], 0);
        }
        for i in 0..MAX_ARGS.min(MAX_USDT_ARGS) {
            if i >= arg_count {
                break;
            }
            let (value, failure) = decode_arg(&regs, &site.args[i]);
            (*event).args[i] = value;
            failures |= failure;
        }
    }
    entry.submit(0);
    count_by(counter::ARG_READ_ERRORS, (failures as u64) >> 63);
}

/// The user registers at the probe, copied once so an argument's register is a stack
/// read at a computed index instead of a helper call per register.
struct Registers {
    /// Written whole by the helper (zeroed on failure), so never left uninitialized; not
    /// zeroed beforehand, which the compiler would do with a loop the verifier walks.
    slots: MaybeUninit<[u64; REGISTER_SLOTS]>,
    /// Negative when the copy failed (the registers then read as 0).
    failure: i64,
}

const REGISTER_SLOTS: usize = core::mem::size_of::<pt_regs>() / 8;

impl Registers {
    #[inline(always)]
    fn snapshot(ctx: &ProbeContext) -> Self {
        let mut slots = MaybeUninit::<[u64; REGISTER_SLOTS]>::uninit();
        // SAFETY: the destination is a stack buffer the size of pt_regs; the helper checks
        // the source (and zeroes the destination on failure).
        let failure = unsafe {
            bpf_probe_read_kernel_raw(
                slots.as_mut_ptr() as *mut c_void,
                core::mem::size_of::<pt_regs>() as u32,
                ctx.as_ptr() as *const c_void,
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
fn decode_arg(regs: &Registers, arg: &UsdtArg) -> (u64, i64) {
    let base = regs.get(arg.reg_off);
    let (raw, failure) = match arg.kind {
        arg_kind::CONST => (arg.val_off as u64, 0),
        arg_kind::REG => (base, 0),
        arg_kind::REG_DEREF | arg_kind::REG_DEREF_INDEXED => {
            let index = regs.get(arg.idx_reg_off).wrapping_mul(arg.scale as u64);
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
    let len = (size.wrapping_sub(1) & 7) as u32 + 1;
    // SAFETY: `len` is at most 8, the size of `value`; the helper validates the user
    // address and reports faults.
    let failure = unsafe {
        bpf_probe_read_user_raw((&mut value as *mut u64).cast(), len, addr as *const c_void)
    };
    (value, failure)
}

/// [`widen`] without a branch: sign extension as `(x ^ m) - m`, `m` the sign bit when
/// signed and 0 when not.
#[inline(always)]
fn widen_branchless(raw: u64, size: u8, signed: u8) -> u64 {
    let bits = 8 * ((size.wrapping_sub(1) & 7) as u32 + 1);
    let low = raw & (u64::MAX >> (64 - bits));
    let sign = ((signed & 1) as u64) << (bits - 1);
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
            let index = register(ctx, arg.idx_reg_off).wrapping_mul(arg.scale as u64);
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
    let addr = (ctx.as_ptr() as *const u8).wrapping_add(reg_off as usize) as *const u64;
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
    let shift = 64 - 8 * (size.clamp(1, 8) as u32);
    if signed {
        (((raw << shift) as i64) >> shift) as u64
    } else {
        (raw << shift) >> shift
    }
}
