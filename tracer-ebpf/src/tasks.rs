//! Runtime tasks (Julia tasks, tokio tasks, JVM threads) from their task-switch probes:
//! time each task spends running and parked, parked time by the user stack where it
//! parked. Keyed by the runtime's own task id, so tasks that migrate between threads are
//! followed.

use aya_ebpf::{bindings::BPF_F_USER_STACK, programs::ProbeContext};
use tracer_common::{
    MAX_USDT_ARGS, OffCpuTotal, TASK_IS_THREAD, TaskId, TaskKey, TaskState, UsdtSite, counter,
    site_flags, task_phase,
};

use crate::{TASK_STATES, TASK_TIME, args::read_arg, count, stacks::stack_id};

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
    let finishing = site.flags & site_flags::TASK_FINISH != 0;
    let running = site.flags & site_flags::TASK_RUN != 0;
    let Some(state) = TASK_STATES.get_ptr_mut(&id) else {
        if finishing {
            return;
        }
        // First sight of this task: start its clock in the phase the probe announces.
        let state = if running {
            TaskState {
                run_start_ns: now,
                ..TaskState::default()
            }
        } else {
            TaskState {
                park_start_ns: now,
                park_stack_id: park_stack(ctx),
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
                _pad: 0,
            },
            now - state.park_start_ns,
        );
    }
    if state.run_start_ns != 0 {
        add(
            TaskKey {
                task,
                tgid,
                phase: task_phase::RUNNING,
                stack_id: -1,
                _pad: 0,
            },
            now - state.run_start_ns,
        );
    }
}

/// The user stack where the task parks.
#[inline(always)]
fn park_stack(ctx: &ProbeContext) -> i32 {
    stack_id(ctx, BPF_F_USER_STACK as u64)
}

#[inline(always)]
fn add(key: TaskKey, ns: u64) {
    match TASK_TIME.get_ptr_mut(&key) {
        // SAFETY: map value pointer valid during the program; adds are per task, and a
        // task is on one thread at a time.
        Some(total) => unsafe {
            (*total).total_ns += ns;
            (*total).count += 1;
        },
        None => {
            if TASK_TIME
                .insert(
                    &key,
                    &OffCpuTotal {
                        total_ns: ns,
                        count: 1,
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
