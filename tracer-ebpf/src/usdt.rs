//! USDT probe hits: hit counts, per-thread latencies, events (arguments decoded by
//! `args`) and task switches (handed to `tasks`).

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_ktime_get_ns, generated::bpf_get_attach_cookie},
    programs::ProbeContext,
};
use aya_log_ebpf::debug;
use tracer_common::{
    CLASSIFIES_INNERMOST, HitStackKey, INNERMOST_FRAME, LatencyProcessKey, LatencyStart,
    LatencyStartKey, LatencyStats, MAX_LATENCIES, MAX_LATENCIES_PER_PROBE, MAX_STR_ARGS,
    MAX_STR_LEN, MAX_USDT_ARGS, NO_CLASS, NO_STACK, STACK_NOT_TAKEN, STR_LENGTH_MASK,
    STR_OFFSET_MASK, TimelineEvent, UsdtEvent, UsdtSite, UsdtStrEvent, UsdtStrHeader, counter,
    histogram, process_metric, site_flags, str_read_size, target_filter, timeline_kind,
};

use crate::{
    HIT_STACKS, LATENCY_BY_PROCESS, LATENCY_HIST, LATENCY_STARTS, LATENCY_STATS, PROBE_HITS,
    USDT_EVENTS, USDT_SPECS, USDT_STR_SCRATCH,
    args::{Registers, decode_arg, read_user_str},
    count, count_by,
    snapshot::{self, Regs},
    stacks::stack_id,
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
/// id's. With `STACKS`, hits are also counted by stack (`trace --count --stack`): only
/// that program uses the stack map, so the others never wait for it to be created.
#[inline(always)]
pub fn on_hit<const TASKS: bool, const STACKS: bool, const LATENCIES: usize>(ctx: &ProbeContext) {
    let Some((site, pid_tgid)) = hit_site(ctx) else {
        return;
    };
    if STACKS && site.flags & site_flags::STACKS != 0 {
        count_stacks(ctx, site, pid_tgid);
    }
    let task_flags = site_flags::TASK_RUN
        | site_flags::TASK_PAUSE
        | site_flags::TASK_FINISH
        | site_flags::TASK_NAME;
    let task_switch = TASKS && site.flags & task_flags != 0;
    let classifies = site.class_latency != 0;
    if site.latency_begin_count == 0 && site.latency_end_count == 0 && !task_switch && !classifies {
        return;
    }
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let tid = pid_tgid as u32;
    let frame = frame_of(ctx, site);
    let class = class_of(ctx, site);
    if classifies {
        classify_open(site.class_latency, tid, class);
    }
    end_latencies::<LATENCIES>(site, (pid_tgid >> 32) as u32, tid, now, frame);
    begin_latencies::<LATENCIES>(site, tid, now, frame, class);
    if task_switch {
        crate::tasks::on_task_probe(ctx, site, pid_tgid, now);
    }
}

/// The (user, kernel) stack ids at a hit when its site takes stacks.
#[inline(always)]
fn hit_stacks(ctx: &ProbeContext, site: &UsdtSite) -> (i32, i32) {
    if site.flags & site_flags::STACKS == 0 {
        return (STACK_NOT_TAKEN, STACK_NOT_TAKEN);
    }
    // A uprobe fires in user mode: the kernel stack is normally NO_STACK (nothing
    // below the trap), taken anyway so a probe hit in a system call would show one.
    (stack_id(ctx, u64::from(BPF_F_USER_STACK)), stack_id(ctx, 0))
}

/// [`hit_stacks`] for an event: with `STACK_SNAPSHOT`, the user stack is a snapshot sent
/// before the event (so user space has it when the event arrives), its id in the event.
/// Not in `hit_stacks`: the counting program, which never snapshots, is not made longer
/// to verify.
#[inline(always)]
fn event_stacks(ctx: &ProbeContext, site: &UsdtSite, pid_tgid: u64) -> (i32, i32) {
    if site.flags & site_flags::STACK_SNAPSHOT == 0 {
        return hit_stacks(ctx, site);
    }
    let regs = ctx.regs;
    // SAFETY: a uprobe's context is the user registers at the probe, readable directly.
    let regs = unsafe {
        Regs {
            ip: (*regs).rip,
            sp: (*regs).rsp,
            bp: (*regs).rbp,
            cs: (*regs).cs,
        }
    };
    let id = crate::offcpu::next_snapshot_id();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // SAFETY: the helper reads the clock only.
    let now = unsafe { aya_ebpf::helpers::generated::bpf_ktime_get_ns() };
    let python = crate::python::current_stack::<true>(tgid, tid, now);
    let user = if snapshot::send(&regs, tgid, tid, NO_STACK, id as u32, 0, python) {
        id
    } else {
        count(counter::UNWIND_RING_FULL);
        stack_id(ctx, u64::from(BPF_F_USER_STACK))
    };
    (user, stack_id(ctx, 0))
}

/// One more hit of this probe in this process with these stacks (`--count --stack`).
#[inline(always)]
fn count_stacks(ctx: &ProbeContext, site: &UsdtSite, pid_tgid: u64) {
    let (user_stack_id, kernel_stack_id) = hit_stacks(ctx, site);
    let key = HitStackKey {
        probe_id: site.probe_id,
        tgid: (pid_tgid >> 32) as u32,
        user_stack_id,
        kernel_stack_id,
    };
    match HIT_STACKS.get_ptr_mut(&key) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU.
        Some(hits) => unsafe { *hits += 1 },
        None => {
            if HIT_STACKS.insert(&key, &1, 0).is_err() {
                count(counter::MAP_FULL);
                return;
            }
            announce_stack(&key, pid_tgid);
        }
    }
}

/// Tells user space of a stack counted for the first time, as an event without
/// arguments: it names the stack while the process (and its mappings) still exist,
/// rather than at the end, when a short-lived one is gone. Best effort: without room
/// in the ring, user space reads the process's mappings later, if it still runs.
#[inline(always)]
fn announce_stack(key: &HitStackKey, pid_tgid: u64) {
    let Some(mut entry) = USDT_EVENTS.reserve::<UsdtEvent>(0) else {
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points at a reserved, writable ring buffer slot of the right size;
    // every field is written before submit.
    unsafe {
        (*event).ts_ns = bpf_ktime_get_ns();
        (*event).pid = (pid_tgid >> 32) as u32;
        (*event).tid = pid_tgid as u32;
        (*event).probe_id = key.probe_id;
        (*event).arg_count = 0;
        (*event).unavailable = 0;
        (*event).user_stack_id = key.user_stack_id;
        (*event).kernel_stack_id = key.kernel_stack_id;
        // Volatile for the reason given in `emit_event`.
        for i in 0..MAX_USDT_ARGS {
            core::ptr::write_volatile(&raw mut (*event).args[i], 0);
        }
    }
    entry.submit(0);
}

/// Every hit with its decoded arguments, through the ring buffer (`tracer trace`).
#[inline(always)]
pub fn on_hit_with_event<const MAX_ARGS: usize, const STACKS: bool>(ctx: &ProbeContext) {
    let Some((site, pid_tgid)) = hit_site(ctx) else {
        return;
    };
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    emit_event::<MAX_ARGS, STACKS>(ctx, site, pid_tgid, now);
}

/// [`on_hit_with_event`] for sites with string arguments.
#[inline(always)]
pub fn on_hit_with_strings(ctx: &ProbeContext) {
    let Some((site, pid_tgid)) = hit_site(ctx) else {
        return;
    };
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    emit_event_with_strings(ctx, site, pid_tgid, now);
}

/// The function frame a frame-keyed latency is open at: the stack pointer at the
/// function's entry, which its return probe sees one return address higher.
#[inline(always)]
fn frame_of(ctx: &ProbeContext, site: &UsdtSite) -> u64 {
    if site.latency_frames == 0 {
        return 0;
    }
    // SAFETY: a uprobe's context is the user registers at the probe, readable directly.
    let sp = unsafe { (*ctx.regs).rsp };
    match site.flags & site_flags::RETURN_PROBE {
        0 => sp,
        _ => sp.wrapping_sub(8),
    }
}

/// The class this site gives latencies (an argument's value), or [`NO_CLASS`].
#[inline(always)]
fn class_of(ctx: &ProbeContext, site: &UsdtSite) -> u32 {
    let index = (site.class_arg as usize).wrapping_sub(1);
    if index >= MAX_USDT_ARGS {
        return NO_CLASS;
    }
    crate::args::read_arg(ctx, &site.args[index]) as u32
}

/// Gives the latency open on thread `tid` that `class_latency` names (see
/// `UsdtSite::class_latency`) its class: its innermost call when it is frame-keyed.
#[inline(always)]
fn classify_open(class_latency: u8, tid: u32, class: u32) {
    let latency_id = u32::from(class_latency & !CLASSIFIES_INNERMOST) - 1;
    let mut key = LatencyStartKey {
        tid,
        latency_id,
        frame: 0,
    };
    if class_latency & CLASSIFIES_INNERMOST != 0 {
        key.frame = INNERMOST_FRAME;
        // SAFETY: the value is copied out.
        match unsafe { LATENCY_STARTS.get(&key) } {
            Some(innermost) => key.frame = innermost.start_ns,
            None => return,
        }
    }
    if let Some(start) = LATENCY_STARTS.get_ptr_mut(&key) {
        // The first class given wins: Julia collects again within one collection when the
        // first pass asks for it, as an automatic one.
        // SAFETY: the entry is this thread's, written by no one else.
        unsafe {
            if (*start).class == NO_CLASS {
                (*start).class = class;
            }
        }
    }
}

#[inline(always)]
fn begin_latencies<const LATENCIES: usize>(
    site: &UsdtSite,
    tid: u32,
    now: u64,
    frame: u64,
    class: u32,
) {
    for i in 0..LATENCIES.min(MAX_LATENCIES_PER_PROBE) {
        if i >= site.latency_begin_count as usize {
            break;
        }
        let key = LatencyStartKey {
            tid,
            latency_id: site.latency_begins[i],
            frame: if site.latency_frames & (1 << i) != 0 {
                frame
            } else {
                0
            },
        };
        let start = LatencyStart {
            start_ns: now,
            class,
            _pad: 0,
        };
        // Counted only: a log here would make the program every `attach` starts with
        // longer to relocate and verify (bench figure 4).
        if LATENCY_STARTS.insert(&key, &start, 0).is_err() {
            count(counter::MAP_FULL);
        }
        if site.latency_innermost & (1 << i) != 0 {
            let innermost = LatencyStart {
                start_ns: frame,
                class: NO_CLASS,
                _pad: 0,
            };
            let key = LatencyStartKey {
                frame: INNERMOST_FRAME,
                ..key
            };
            let _ = LATENCY_STARTS.insert(&key, &innermost, 0);
        }
    }
}

#[inline(always)]
fn end_latencies<const LATENCIES: usize>(
    site: &UsdtSite,
    tgid: u32,
    tid: u32,
    now: u64,
    frame: u64,
) {
    for i in 0..LATENCIES.min(MAX_LATENCIES_PER_PROBE) {
        if i >= site.latency_end_count as usize {
            break;
        }
        let latency_id = site.latency_ends[i];
        let key = LatencyStartKey {
            tid,
            latency_id,
            frame: if site.latency_frames & (16 << i) != 0 {
                frame
            } else {
                0
            },
        };
        // SAFETY: the value is copied out before the entry is removed.
        match unsafe { LATENCY_STARTS.get(&key) } {
            Some(&LatencyStart {
                start_ns: start,
                class,
                ..
            }) => {
                let _ = LATENCY_STARTS.remove(&key);
                record_latency(latency_id, tgid, class, now.saturating_sub(start));
                crate::timeline(&TimelineEvent {
                    start_ns: start,
                    end_ns: now,
                    task: 0,
                    tgid,
                    tid,
                    kind: timeline_kind::LATENCY,
                    detail: latency_id,
                });
            }
            None => count(counter::UNMATCHED_ENDS),
        }
    }
}

#[inline(always)]
fn record_latency(latency_id: u32, tgid: u32, class: u32, ns: u64) {
    if latency_id >= MAX_LATENCIES {
        return;
    }
    let bucket = histogram::bucket_of(ns);
    if let Some(slot) = LATENCY_HIST.get_ptr_mut(latency_id * histogram::BUCKETS + bucket) {
        // SAFETY: an aligned u64 of the array, only ever added to atomically (xadd).
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(slot, 1) };
    }
    crate::add_process_metric(
        tgid,
        process_metric::LATENCY_COUNT,
        latency_id * histogram::BUCKETS + bucket,
        1,
    );
    crate::add_process_metric(tgid, process_metric::LATENCY_NS, latency_id, ns);
    if let Some(stats) = LATENCY_STATS.get_ptr_mut(latency_id) {
        // SAFETY: as above.
        add_to(unsafe { &mut *stats }, ns);
    }
    let key = LatencyProcessKey {
        tgid,
        latency_id,
        class,
    };
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
fn emit_event<const MAX_ARGS: usize, const STACKS: bool>(
    ctx: &ProbeContext,
    site: &UsdtSite,
    pid_tgid: u64,
    now: u64,
) {
    let Some(mut entry) = USDT_EVENTS.reserve::<UsdtEvent>(0) else {
        count(counter::EVENTS_LOST);
        return;
    };
    let failures = fill_event::<MAX_ARGS, STACKS>(ctx, site, pid_tgid, now, entry.as_mut_ptr());
    entry.submit(0);
    report_read_failures(ctx, site, failures);
}

/// Counts a hit whose argument reads failed (`failures` negative: the OR of the helpers'
/// results) and, with `--bpf-debug`, says which probe and site.
#[inline(always)]
fn report_read_failures(ctx: &ProbeContext, site: &UsdtSite, failures: i64) {
    count_by(counter::ARG_READ_ERRORS, (failures as u64) >> 63);
    if failures < 0 {
        debug!(
            ctx,
            "probe {} (site {}): reading an argument failed: error {}",
            site.probe_id,
            // SAFETY: the helper only reads the context it is given.
            unsafe { bpf_get_attach_cookie(ctx.as_ptr()) },
            failures
        );
    }
}

/// An event followed by its strings (see `UsdtStrHeader`), assembled in this CPU's
/// scratch buffer and copied to the ring buffer at its length. Uprobe programs run with
/// migration disabled but may be preempted on a preemptible kernel, and another task's
/// hit on this CPU would then share the buffer: a claim count guards it, and a program
/// that finds it claimed drops its event (counted as lost) instead.
#[inline(always)]
fn emit_event_with_strings(ctx: &ProbeContext, site: &UsdtSite, pid_tgid: u64, now: u64) {
    let Some(scratch) = USDT_STR_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: `users` is an aligned u64 of this CPU's slot, only ever used atomically.
    let users = unsafe { &raw mut (*scratch).users };
    // An add whose result is unused is one instruction (xadd), so preemption cannot
    // split it; whoever then reads 1 is alone until it takes its claim back. (Adding
    // u64::MAX subtracts 1: the BPF ISA before v3 has no atomic subtract.)
    // SAFETY: `users` points into a map value, valid while the program runs.
    let claim = |delta: u64| unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(users, delta);
    };
    claim(1);
    // A volatile load: an atomic one has no BPF instruction before v3, and only this
    // CPU writes the count (a context switch orders its memory).
    // SAFETY: as above.
    if unsafe { core::ptr::read_volatile(users) } != 1 {
        claim(u64::MAX);
        count(counter::EVENTS_LOST);
        return;
    }
    fill_strings(ctx, site, pid_tgid, now, scratch);
    claim(u64::MAX);
}

/// [`emit_event_with_strings`] once the buffer is claimed.
#[inline(always)]
fn fill_strings(
    ctx: &ProbeContext,
    site: &UsdtSite,
    pid_tgid: u64,
    now: u64,
    scratch: *mut UsdtStrEvent,
) {
    // SAFETY: `scratch` is this CPU's slot of the map, valid for the whole program.
    let event = unsafe { &raw mut (*scratch).event };
    let failures = fill_event::<MAX_USDT_ARGS, true>(ctx, site, pid_tgid, now, event);
    // SAFETY: as above; the area is plain bytes.
    let area = unsafe { &raw mut (*scratch).area }.cast::<u8>();
    const HEADER: usize = core::mem::size_of::<UsdtStrHeader>();
    let mut end = 0usize;
    for i in 0..MAX_STR_ARGS {
        if i >= site.str_count as usize {
            break;
        }
        let arg = site.str_args[i] as usize;
        let pointer = match arg < MAX_USDT_ARGS {
            // SAFETY: `arg` is bounded by the check; the event was just filled.
            true => unsafe { (*event).args[arg] },
            false => 0,
        };
        let max = site.str_max[i].min(MAX_STR_LEN);
        let size = str_read_size(max) as usize & STR_LENGTH_MASK;
        let start = end & STR_OFFSET_MASK;
        // SAFETY: `start + HEADER + size` is within the area by the masks (see
        // `UsdtStrEvent`).
        let result = unsafe {
            let data = area.add(start + HEADER);
            let result = read_user_str(data, size as u32, pointer);
            let header = area.add(start).cast::<UsdtStrHeader>();
            core::ptr::write_unaligned(
                header,
                UsdtStrHeader {
                    result: result as i32,
                    arg: arg as u8,
                    _pad: 0,
                    max,
                },
            );
            result
        };
        let copied = if result > 0 {
            result as usize & STR_LENGTH_MASK
        } else {
            0
        };
        end = start + HEADER + copied;
    }
    let len = core::mem::size_of::<UsdtEvent>() + end;
    // SAFETY: `len` is at most the scratch's size (the masks again), all of it written
    // up to `len`.
    let record = unsafe { core::slice::from_raw_parts(scratch as *const u8, len) };
    if USDT_EVENTS.output(record, 0).is_err() {
        count(counter::EVENTS_LOST);
    }
    report_read_failures(ctx, site, failures);
}

/// Writes the fixed part of an event, its first `MAX_ARGS` arguments decoded; returns
/// the read failures OR-ed together (negative if any).
#[inline(always)]
fn fill_event<const MAX_ARGS: usize, const STACKS: bool>(
    ctx: &ProbeContext,
    site: &UsdtSite,
    pid_tgid: u64,
    now: u64,
    event: *mut UsdtEvent,
) -> i64 {
    let arg_count = (site.arg_count as usize).min(MAX_ARGS).min(MAX_USDT_ARGS);
    let (user_stack_id, kernel_stack_id) = if STACKS {
        event_stacks(ctx, site, pid_tgid)
    } else {
        (STACK_NOT_TAKEN, STACK_NOT_TAKEN)
    };
    let regs = Registers::snapshot(ctx);
    // Read failures (negative helper results) are OR-ed together and counted once, without
    // a branch: branches on them would multiply the paths the verifier walks, and so its
    // time at launch.
    let mut failures = regs.failure;
    // SAFETY: `event` points at writable memory of the right size (a ring buffer slot or
    // the scratch buffer); every field is written before it is sent.
    unsafe {
        (*event).ts_ns = now;
        (*event).pid = (pid_tgid >> 32) as u32;
        (*event).tid = pid_tgid as u32;
        (*event).probe_id = site.probe_id;
        (*event).arg_count = arg_count as u16;
        (*event).unavailable = site.unavailable;
        (*event).user_stack_id = user_stack_id;
        (*event).kernel_stack_id = kernel_stack_id;
        // Volatile stores, so the compiler does not turn them into a call to a memset loop
        // that the verifier would walk byte by byte.
        for i in 0..MAX_USDT_ARGS {
            core::ptr::write_volatile(&raw mut (*event).args[i], 0);
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
    failures
}
