//! USDT probe hits: hit counts, per-thread latencies, and argument decoding for events.

use aya_ebpf::{
    EbpfContext as _,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
        generated::bpf_get_attach_cookie,
    },
    programs::ProbeContext,
};
use tracer_common::{
    LatencyStartKey, MAX_LATENCIES, MAX_LATENCIES_PER_PROBE, MAX_USDT_ARGS, UsdtArg, UsdtEvent,
    UsdtSite, arg_kind, counter, histogram, site_flags,
};

use crate::{
    LATENCY_HIST, LATENCY_STARTS, LATENCY_STATS, PROBE_HITS, USDT_EVENTS, USDT_SPECS, count,
};

/// The site whose uprobe fired, found through the link's BPF cookie, counted as a hit.
#[inline(always)]
fn hit_site(ctx: &ProbeContext) -> Option<&'static UsdtSite> {
    if crate::stopped() {
        return None;
    }
    // SAFETY: the helper only reads the cookie of the link that ran this program.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let site = USDT_SPECS.get(cookie)?;
    if let Some(hits) = PROBE_HITS.get_ptr_mut(site.probe_id) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *hits += 1 };
    }
    Some(site)
}

/// Counting, latencies and tasks: no argument decoding but a task id's.
#[inline(always)]
pub fn on_hit(ctx: &ProbeContext) {
    let Some(site) = hit_site(ctx) else {
        return;
    };
    let task_flags = site_flags::TASK_RUN | site_flags::TASK_PAUSE | site_flags::TASK_FINISH;
    if site.latency_begin_count == 0 && site.latency_end_count == 0 && site.flags & task_flags == 0
    {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    end_latencies(site, tid, now);
    begin_latencies(site, tid, now);
    if site.flags & task_flags != 0 {
        crate::tasks::on_task_probe(ctx, site, pid_tgid, now);
    }
}

/// Every hit with its decoded arguments, through the ring buffer (`tracer trace`).
#[inline(always)]
pub fn on_hit_with_event(ctx: &ProbeContext) {
    let Some(site) = hit_site(ctx) else {
        return;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    emit_event(ctx, site, bpf_get_current_pid_tgid(), now);
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
fn end_latencies(site: &UsdtSite, tid: u32, now: u64) {
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
                record_latency(latency_id, now.saturating_sub(start));
            }
            None => count(counter::UNMATCHED_ENDS),
        }
    }
}

#[inline(always)]
fn record_latency(latency_id: u32, ns: u64) {
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
        let stats = unsafe { &mut *stats };
        if stats.count == 0 || ns < stats.min_ns {
            stats.min_ns = ns;
        }
        if ns > stats.max_ns {
            stats.max_ns = ns;
        }
        stats.count += 1;
        stats.total_ns += ns;
    }
}

#[inline(always)]
fn emit_event(ctx: &ProbeContext, site: &UsdtSite, pid_tgid: u64, now: u64) {
    let Some(mut entry) = USDT_EVENTS.reserve::<UsdtEvent>(0) else {
        count(counter::EVENTS_LOST);
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points at a reserved, writable ring buffer slot of the right size;
    // every field is written before submit.
    unsafe {
        (*event).ts_ns = now;
        (*event).pid = (pid_tgid >> 32) as u32;
        (*event).tid = pid_tgid as u32;
        (*event).probe_id = site.probe_id;
        (*event).arg_count = site.arg_count as u32;
        for i in 0..MAX_USDT_ARGS {
            (*event).args[i] = if i < site.arg_count as usize {
                read_arg(ctx, &site.args[i])
            } else {
                0
            };
        }
    }
    entry.submit(0);
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
    // SAFETY: the helper validates the user address and reports faults.
    let value = unsafe {
        match size {
            1 => bpf_probe_read_user(addr as *const u8).map(u64::from),
            2 => bpf_probe_read_user(addr as *const u16).map(u64::from),
            4 => bpf_probe_read_user(addr as *const u32).map(u64::from),
            _ => bpf_probe_read_user(addr as *const u64),
        }
    };
    value.unwrap_or_else(|_| {
        count(counter::ARG_READ_ERRORS);
        0
    })
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
