//! Parsers of the per-thread files of `/proc/PID/task/TID/`: `stat`, `syscall`, `sched`,
//! `schedstat` and `stack`. The thread states and system calls they tell are defined here.

use super::syscalls;

/// What a thread is doing, from its state letter in `/proc/PID/task/TID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ThreadState {
    /// On a CPU (`R`, its CPU time growing).
    Running,
    /// Waiting for a CPU (`R`, its CPU time not growing).
    Runnable,
    /// `S`: interruptible sleep (waiting for an event).
    Sleeping,
    /// `D`: uninterruptible sleep (usually I/O).
    DiskSleep,
    /// `T`: stopped by a signal.
    Stopped,
    /// `t`: stopped by a debugger.
    TracingStop,
    /// `Z`: exited, not yet reaped.
    Zombie,
    /// `X`: being removed.
    Dead,
    /// `I`: an idle kernel thread.
    Idle,
    /// `P`: a parked kernel thread.
    Parked,
    /// Any other letter.
    Other(char),
}

impl ThreadState {
    /// The state of letter `c` (`R` is taken as [`ThreadState::Running`]).
    pub(crate) fn from_letter(c: char) -> Self {
        match c {
            'R' => Self::Running,
            'S' => Self::Sleeping,
            'D' => Self::DiskSleep,
            'T' => Self::Stopped,
            't' => Self::TracingStop,
            'Z' => Self::Zombie,
            'X' | 'x' => Self::Dead,
            'I' => Self::Idle,
            'P' => Self::Parked,
            c => Self::Other(c),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Runnable => "runnable",
            Self::Sleeping => "sleeping",
            Self::DiskSleep => "disk sleep",
            Self::Stopped => "stopped",
            Self::TracingStop => "tracing stop",
            Self::Zombie => "zombie",
            Self::Dead => "dead",
            Self::Idle => "idle",
            Self::Parked => "parked",
            Self::Other(_) => "unknown",
        }
    }
}

/// A system call a thread is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Syscall {
    pub nr: u64,
    pub args: [u64; 6],
}

impl Syscall {
    /// Its x86-64 name (`futex`), or `syscall N`. (A 32-bit process's numbers are the
    /// i386 ones, which this does not tell apart.)
    pub(crate) fn name(&self) -> String {
        match syscalls::name(self.nr) {
            Some(name) => name.to_string(),
            None => format!("syscall {}", self.nr),
        }
    }
}

/// One line of `/proc/PID/task/TID/syscall`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SyscallLine {
    /// `running`: the thread was runnable, so its registers could not be read.
    Running,
    /// In the kernel but not in a system call (`-1 SP PC`).
    NotInSyscall {
        sp: u64,
        pc: u64,
    },
    InSyscall {
        syscall: Syscall,
        sp: u64,
        pc: u64,
    },
}

/// Parses `/proc/PID/task/TID/syscall`; `None` if malformed.
pub(crate) fn parse_syscall_line(text: &str) -> Option<SyscallLine> {
    let text = text.trim();
    if text == "running" {
        return Some(SyscallLine::Running);
    }
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    match fields.as_slice() {
        ["-1", sp, pc] => Some(SyscallLine::NotInSyscall {
            sp: hex(sp)?,
            pc: hex(pc)?,
        }),
        [nr, a0, a1, a2, a3, a4, a5, sp, pc] => Some(SyscallLine::InSyscall {
            syscall: Syscall {
                nr: nr.parse().ok()?,
                args: [hex(a0)?, hex(a1)?, hex(a2)?, hex(a3)?, hex(a4)?, hex(a5)?],
            },
            sp: hex(sp)?,
            pc: hex(pc)?,
        }),
        _ => None,
    }
}

/// The fields of `/proc/PID/task/TID/stat` used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stat {
    /// The name between the parentheses (it may hold anything, parentheses included).
    pub comm: String,
    pub state: char,
    /// A kernel thread (`PF_KTHREAD` in the flags, field 9): no user space.
    pub kernel_thread: bool,
    /// The CPU it last ran on (field 39).
    pub cpu: Option<u32>,
}

/// `PF_KTHREAD` of `include/linux/sched.h`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Parses `/proc/PID/task/TID/stat`; `None` if malformed.
pub(crate) fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    // From field 3, the state.
    let fields: Vec<&str> = text.get(close + 1..)?.split_ascii_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied();
    let state = field(3)?.chars().next()?;
    let flags: u64 = field(9).and_then(|f| f.parse().ok()).unwrap_or(0);
    Some(Stat {
        comm,
        state,
        kernel_thread: flags & PF_KTHREAD != 0,
        cpu: field(39).and_then(|f| f.parse().ok()),
    })
}

/// `se.exec_start` of `/proc/PID/task/TID/sched` (milliseconds with six decimals) in
/// nanoseconds; `None` when absent or 0 (a thread just moved to another CPU).
pub(crate) fn parse_sched_exec_start(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("se.exec_start"))?;
    let value = line.split_once(':')?.1.trim();
    let (ms, frac) = value.split_once('.').unwrap_or((value, "0"));
    if frac.is_empty() || frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac: u64 = format!("{frac:0<6}").parse().ok()?;
    let ns = ms
        .parse::<u64>()
        .ok()?
        .checked_mul(1_000_000)?
        .checked_add(frac)?;
    (ns > 0).then_some(ns)
}

/// The CPU time (ns) of `/proc/PID/task/TID/schedstat`: its first field.
pub(crate) fn parse_schedstat_runtime(text: &str) -> Option<u64> {
    text.split_ascii_whitespace().next()?.parse().ok()
}

/// The function names of `/proc/PID/task/TID/stack`, innermost first: `[<0>]
/// futex_do_wait+0x46/0x90` gives `futex_do_wait` (a ` [module]` after it is dropped).
pub(crate) fn parse_kernel_stack(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = match line.strip_prefix("[<") {
                Some(rest) => rest.split_once(">]")?.1.trim_start(),
                None => line,
            };
            let symbol = rest.split_ascii_whitespace().next()?;
            let name = match symbol.rsplit_once('+') {
                Some((name, offset)) if offset.starts_with("0x") => name,
                _ => symbol,
            };
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn parses_syscall_lines() {
        let futex = "202 0x5647f4321080 0x80 0x0 0x0 0x0 0x0 0x7fce3b463e88 0x7fce3c4f012b\n";
        assert_eq!(
            parse_syscall_line(futex),
            Some(SyscallLine::InSyscall {
                syscall: Syscall {
                    nr: 202,
                    args: [0x5647f4321080, 0x80, 0, 0, 0, 0]
                },
                sp: 0x7fce3b463e88,
                pc: 0x7fce3c4f012b,
            })
        );
        assert_eq!(
            parse_syscall_line("-1 0x7ffd1000 0x401000\n"),
            Some(SyscallLine::NotInSyscall {
                sp: 0x7ffd1000,
                pc: 0x401000
            })
        );
        assert_eq!(parse_syscall_line("running\n"), Some(SyscallLine::Running));
        for bad in [
            "",
            "202 0x1",
            "x 0x0 0x0 0x0 0x0 0x0 0x0 0x0 0x0",
            "-1 12 0x1",
        ] {
            assert_eq!(parse_syscall_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn names_syscalls() {
        let name = |nr: i64| {
            Syscall {
                nr: nr as u64,
                args: [0; 6],
            }
            .name()
        };
        for (nr, expected) in [
            (libc::SYS_read, "read"),
            (libc::SYS_write, "write"),
            (libc::SYS_futex, "futex"),
            (libc::SYS_nanosleep, "nanosleep"),
            (libc::SYS_clock_nanosleep, "clock_nanosleep"),
            (libc::SYS_poll, "poll"),
            (libc::SYS_ppoll, "ppoll"),
            (libc::SYS_select, "select"),
            (libc::SYS_pselect6, "pselect6"),
            (libc::SYS_epoll_wait, "epoll_wait"),
            (libc::SYS_epoll_pwait, "epoll_pwait"),
            (libc::SYS_epoll_pwait2, "epoll_pwait2"),
            (libc::SYS_accept, "accept"),
            (libc::SYS_accept4, "accept4"),
            (libc::SYS_recvfrom, "recvfrom"),
            (libc::SYS_recvmsg, "recvmsg"),
            (libc::SYS_connect, "connect"),
            (libc::SYS_wait4, "wait4"),
            (libc::SYS_waitid, "waitid"),
            (libc::SYS_pause, "pause"),
            (libc::SYS_rt_sigsuspend, "rt_sigsuspend"),
            (libc::SYS_rt_sigtimedwait, "rt_sigtimedwait"),
            (libc::SYS_msgrcv, "msgrcv"),
            (libc::SYS_semop, "semop"),
            (libc::SYS_io_getevents, "io_getevents"),
            (libc::SYS_io_uring_enter, "io_uring_enter"),
            (libc::SYS_sched_yield, "sched_yield"),
            (libc::SYS_futex_waitv, "futex_waitv"),
            (libc::SYS_mseal, "mseal"),
        ] {
            assert_eq!(name(nr), expected, "{nr}");
        }
        assert_eq!(name(455), "futex_wait");
        assert_eq!(name(1000), "syscall 1000");
        assert_eq!(name(-1), format!("syscall {}", u64::MAX));
    }

    #[test]
    fn parses_stat() {
        let stat = "4243 (worker) 1) S 4242 4242 1 0 -1 4194368 100 0 0 0 5 3 0 0 20 0 5 0 \
                    1000 10000000 200 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 -1 1 0 0 \
                    0 0 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(
            parse_stat(stat),
            Some(Stat {
                comm: "worker) 1".to_string(),
                state: 'S',
                kernel_thread: false,
                cpu: Some(1),
            })
        );
        let kthreadd = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 9";
        assert!(parse_stat(kthreadd).unwrap().kernel_thread);
        let short = parse_stat("1 (x) R 0").unwrap();
        assert_eq!(
            (short.state, short.cpu, short.kernel_thread),
            ('R', None, false)
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x)"), None);
    }

    #[test]
    fn parses_our_own_stat() {
        let stat = fs::read_to_string("/proc/thread-self/stat").unwrap();
        let stat = parse_stat(&stat).unwrap();
        assert_eq!(stat.state, 'R');
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        assert!(stat.cpu.is_some(), "{stat:?}");
        assert!(cpu >= 0);
    }

    #[test]
    fn states() {
        let names: Vec<&str> = "RSDTtZXIPW"
            .chars()
            .map(|c| ThreadState::from_letter(c).name())
            .collect();
        assert_eq!(
            names,
            [
                "running",
                "sleeping",
                "disk sleep",
                "stopped",
                "tracing stop",
                "zombie",
                "dead",
                "idle",
                "parked",
                "unknown"
            ]
        );
        assert_eq!(ThreadState::Runnable.name(), "runnable");
    }

    #[test]
    fn parses_sched() {
        let sched = "sleep (8538, #threads: 1)\n\
                     -------------------------------------------------------------------\n\
                     se.exec_start                                :       1597054.930687\n\
                     se.vruntime                                  :            99.390350\n";
        assert_eq!(parse_sched_exec_start(sched), Some(1_597_054_930_687));
        assert_eq!(
            parse_sched_exec_start("se.exec_start : 12.5\n"),
            Some(12_500_000)
        );
        assert_eq!(
            parse_sched_exec_start("se.exec_start : 7\n"),
            Some(7_000_000)
        );
        assert_eq!(
            parse_sched_exec_start("se.exec_start :    0.000000\n"),
            None
        );
        assert_eq!(parse_sched_exec_start("se.vruntime : 1.0\n"), None);
        assert_eq!(parse_sched_exec_start("se.exec_start : 1.x\n"), None);
        assert_eq!(parse_schedstat_runtime("123456 789 10\n"), Some(123456));
        assert_eq!(parse_schedstat_runtime(""), None);
    }

    #[test]
    fn parses_kernel_stacks() {
        let stack = "[<0>] futex_do_wait+0x46/0x90\n\
                     [<0>] __futex_wait+0x92/0x120\n\
                     [<0>] nfs_wait_bit_killable+0x1e/0x90 [nfs]\n\
                     [<0>] entry_SYSCALL_64_after_hwframe+0x76/0x7e\n\
                     \n";
        assert_eq!(
            parse_kernel_stack(stack),
            [
                "futex_do_wait",
                "__futex_wait",
                "nfs_wait_bit_killable",
                "entry_SYSCALL_64_after_hwframe"
            ]
        );
        assert!(parse_kernel_stack("").is_empty());
        assert_eq!(
            parse_kernel_stack("[<0>] 0xffffffffc0001234\n"),
            ["0xffffffffc0001234"]
        );
    }
}
