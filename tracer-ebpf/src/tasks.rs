//! Runtime tasks (Julia tasks, tokio tasks, JVM threads) from their task-switch probes:
//! time each task spends running and parked, parked time by the user stack where it
//! parked. Keyed by the runtime's own task id, so tasks that migrate between threads are
//! followed. While a task runs, its thread's entry in `THREAD_TASKS` names it, so the
//! scheduler programs put the thread's time then under the task too (`TASK_WALL`); a
//! naming probe (a spawn with its location, a task's name) fills `TASK_NAMES`.

use aya_ebpf::{bindings::BPF_F_USER_STACK, programs::ProbeContext};
use tracer_common::{
    FINISHED_IN_RUN, MAX_USDT_ARGS, TASK_IS_THREAD, TASK_NAME_BYTES, TaskId, TaskKey, TaskName,
    TaskState, TaskTotal, TimelineEvent, UsdtSite, counter, site_flags, task_phase, timeline_kind,
};

use crate::{
    TASK_NAMES, TASK_STATES, TASK_TIME, THREAD_TASKS,
    args::{read_arg, read_user_str},
    count,
    stacks::stack_id,
};

#[inline(always)]
pub fn on_task_probe(ctx: &ProbeContext, site: &UsdtSite, pid_tgid: u64, now: u64) {
    let tgid = (pid_tgid >> 32) as u32;
    let task = if site.task_arg == TASK_IS_THREAD {
        pid_tgid & 0xffff_ffff
    } else if (site.task_arg as usize) < MAX_USDT_ARGS {
        read_arg(ctx, &site.args[site.task_arg as usize])
    } else {
        return;
    };
    let id = TaskId {
        task,
        tgid,
        _pad: 0,
    };
    let tid = pid_tgid as u32;
    if site.flags & site_flags::TASK_NAME != 0 {
        name_task(ctx, site, &id);
    }
    let finishing = site.flags & site_flags::TASK_FINISH != 0;
    let running = site.flags & site_flags::TASK_RUN != 0;
    if !finishing && !running && site.flags & site_flags::TASK_PAUSE == 0 {
        return;
    }
    // The thread's time is the task's from its run probe to its pause. A task that
    // finishes inside its last run (tokio's and Julia's order: run, finish, pause) is
    // marked finished on its thread: the rest of that run (a scheduler looking for the
    // next task) is the thread's, and the pause ends nothing.
    // SAFETY: the value is copied out at once.
    let thread_task = unsafe { THREAD_TASKS.get(&tid) }.copied();
    if running {
        if THREAD_TASKS.insert(&tid, &task, 0).is_err() {
            count(counter::MAP_FULL);
        }
    } else if finishing {
        if thread_task == Some(task) {
            let _ = THREAD_TASKS.insert(&tid, &(task | FINISHED_IN_RUN), 0);
        }
    } else {
        let _ = THREAD_TASKS.remove(&tid);
    }
    let Some(state) = TASK_STATES.get_ptr_mut(&id) else {
        if finishing || thread_task == Some(task | FINISHED_IN_RUN) {
            return;
        }
        // First sight of this task: start its clock in the phase the probe announces.
        let state = if running {
            TaskState {
                run_start_ns: now,
                tid,
                ..TaskState::default()
            }
        } else {
            TaskState {
                park_start_ns: now,
                park_stack_id: park_stack(ctx),
                tid,
                ..TaskState::default()
            }
        };
        if TASK_STATES.insert(&id, &state, 0).is_err() {
            count(counter::MAP_FULL);
        }
        return;
    };
    // SAFETY: map value pointer, valid during this program run; one task runs on one
    // thread at a time, so its state is not updated concurrently.
    let state = unsafe { &mut *state };
    if finishing {
        // Close whatever interval is open, then forget the task.
        close_interval(state, task, tgid, now);
        let _ = TASK_STATES.remove(&id);
        return;
    }
    // A switch closes the interval that was open and opens the other one.
    close_interval(state, task, tgid, now);
    state.tid = tid;
    if running {
        state.park_start_ns = 0;
        state.run_start_ns = now;
    } else {
        state.run_start_ns = 0;
        state.park_start_ns = now;
        state.park_stack_id = park_stack(ctx);
    }
}

#[inline(always)]
fn close_interval(state: &TaskState, task: u64, tgid: u32, now: u64) {
    if state.park_start_ns != 0 {
        add(
            TaskKey {
                task,
                tgid,
                phase: task_phase::PARKED,
                stack_id: state.park_stack_id,
                tid: state.tid,
            },
            now - state.park_start_ns,
        );
        timeline_interval(
            state,
            task,
            tgid,
            timeline_kind::TASK_PARKED,
            state.park_start_ns,
            now,
        );
    }
    if state.run_start_ns != 0 {
        add(
            TaskKey {
                task,
                tgid,
                phase: task_phase::RUNNING,
                stack_id: -1,
                tid: state.tid,
            },
            now - state.run_start_ns,
        );
        timeline_interval(
            state,
            task,
            tgid,
            timeline_kind::TASK_RUN,
            state.run_start_ns,
            now,
        );
    }
}

#[inline(always)]
fn timeline_interval(state: &TaskState, task: u64, tgid: u32, kind: u32, start: u64, end: u64) {
    crate::timeline(&TimelineEvent {
        start_ns: start,
        end_ns: end,
        task,
        tgid,
        tid: state.tid,
        kind,
        detail: 0,
    });
}

/// Notes what the probe calls the task: the string its `task_name_arg` points to, and
/// the line and column in the two arguments after it when the site has them. The first
/// name stays (a runtime may name a task again at every spawn of its children).
#[inline(always)]
fn name_task(ctx: &ProbeContext, site: &UsdtSite, id: &TaskId) {
    let at = site.task_name_arg as usize;
    let arg = |i: usize| site.args.get(i).filter(|_| i < site.arg_count as usize);
    let Some(name_arg) = arg(at) else {
        return;
    };
    // SAFETY: the value is only tested for presence.
    if unsafe { TASK_NAMES.get(id) }.is_some() {
        return;
    }
    // From a zeroed value in .rodata: one on the stack would take a memset the verifier
    // does not know.
    if TASK_NAMES.insert(id, &NO_NAME, 0).is_err() {
        count(counter::MAP_FULL);
        return;
    }
    let Some(name) = TASK_NAMES.get_ptr_mut(id) else {
        return;
    };
    let number = |i: usize| arg(i).map_or(0, |a| read_arg(ctx, a) as u32);
    let pointer = read_arg(ctx, name_arg);
    // SAFETY: map value pointer, valid during this program run, with room for the
    // bytes; the helper checks the user address and always ends the copy with a NUL.
    unsafe {
        (*name).line = number(at + 1);
        (*name).column = number(at + 2);
        if read_user_str((*name).text.as_mut_ptr(), TASK_NAME_BYTES as u32, pointer) < 0 {
            count(counter::ARG_READ_ERRORS);
            // Not the first name for good: the next naming probe tries again.
            let _ = TASK_NAMES.remove(id);
        }
    }
}

/// An empty [`TaskName`], for a new entry to start from.
static NO_NAME: TaskName = TaskName {
    text: [0; TASK_NAME_BYTES],
    line: 0,
    column: 0,
};

/// The user stack where the task parks.
#[inline(always)]
fn park_stack(ctx: &ProbeContext) -> i32 {
    stack_id(ctx, u64::from(BPF_F_USER_STACK))
}

#[inline(always)]
fn add(key: TaskKey, ns: u64) {
    match TASK_TIME.get_ptr_mut(&key) {
        // SAFETY: map value pointer valid during the program; adds are per task, and a
        // task is on one thread at a time.
        Some(total) => unsafe {
            (*total).total_ns += ns;
            (*total).count += 1;
            if ns > (*total).max_ns {
                (*total).max_ns = ns;
            }
        },
        None => {
            if TASK_TIME
                .insert(
                    &key,
                    &TaskTotal {
                        total_ns: ns,
                        count: 1,
                        max_ns: ns,
                    },
                    0,
                )
                .is_err()
            {
                count(counter::MAP_FULL);
            }
        }
    }
}
