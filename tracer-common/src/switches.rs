//! What user space tells the running programs (`CONTROL`, `HELD`), and what they count
//! (`COUNTERS`).

/// Indices of the `CONTROL` array: switches user space flips while programs run.
pub mod control {
    /// Non-zero once tracing stopped: USDT programs record nothing more while the (slow)
    /// detach proceeds, so the trace ends at one instant and the ring buffer cannot
    /// overflow after the stop.
    pub const STOPPED: u32 = 0;
    /// Non-zero once a CPython interpreter is in `PYTHON_PROCESSES`: until then, stack
    /// snapshots skip looking their process up there.
    pub const PYTHON: u32 = 1;
    /// Non-zero once the wall-clock profile started: until then the scheduler and
    /// sampling programs record nothing, so every thread's time starts at one instant
    /// however long attaching them took (threads blocked then are seeded from it).
    pub const RECORDING: u32 = 2;
    /// Until this second of `CLOCK_MONOTONIC`, a traced process that maps a library is
    /// stopped until its probes are attached (`--hold-at-dlopen`); 0 by default. User
    /// space pushes it a little ahead while it runs: a tracer that dies stops no more.
    pub const HOLD_UNTIL_S: u32 = 3;
    pub const COUNT: u32 = 4;
}

/// Values of the `HELD` map: what the kernel did to a process whose dynamic loader mapped
/// a library.
pub mod held {
    /// Nothing: user space looks at its maps.
    pub const LOOK: u32 = 1;
    /// Stopped it (SIGSTOP): user space looks at its maps and continues it.
    pub const STOPPED: u32 = 2;
}

/// Indices of the `COUNTERS` per-CPU array: things the eBPF side could not record, so
/// user space reports them instead of hiding them.
pub mod counter {
    /// Ring buffer full: a `tracer trace` event was lost.
    pub const EVENTS_LOST: u32 = 0;
    /// A map was full: a latency start or off-CPU interval was dropped.
    pub const MAP_FULL: u32 = 1;
    /// A stack could not be captured (collision in the stack map or a fault).
    pub const STACK_ERRORS: u32 = 2;
    /// A latency end without a matching begin on that thread.
    pub const UNMATCHED_ENDS: u32 = 3;
    /// An argument could not be read from user memory.
    pub const ARG_READ_ERRORS: u32 = 4;
    /// DWARF unwinding: a sample went to the frame-pointer path instead because the
    /// `UNWIND_SAMPLES` ring buffer was full.
    pub const UNWIND_RING_FULL: u32 = 5;
    /// DWARF unwinding: a sample whose user registers could not be had (a kernel thread,
    /// or its saved registers unreadable), walked with frame pointers instead.
    pub const UNWIND_NO_USER_REGS: u32 = 6;
    /// DWARF unwinding: not a single byte of the user stack could be read; sent anyway.
    pub const UNWIND_STACK_UNREADABLE: u32 = 7;
    /// Off-CPU: a thread's switch back in was not seen (the interval was closed at its next
    /// switch out or its death, from the CPU time it had had since).
    pub const SWITCH_INS_MISSED: u32 = 8;
    /// The timeline's ring buffer was full: an interval is missing from it.
    pub const TIMELINE_LOST: u32 = 9;
    /// Of [`STACK_ERRORS`]: another stack held the slot of the stack map the stack's hash
    /// chose (`EEXIST`).
    pub const STACK_COLLISIONS: u32 = 10;
    /// Of [`STACK_ERRORS`]: the stack map had no room left (`ENOMEM`).
    pub const STACK_MAP_FULL: u32 = 11;
    /// Off-CPU with DWARF unwinding: the stack-copy ring was half full, so a thread that
    /// blocked again where its last snapshot still waited to be unwound (same instruction,
    /// stack and frame pointers) reused that snapshot without its check.
    pub const SNAPSHOTS_REUSED_UNCHECKED: u32 = 12;
    pub const COUNT: u32 = 13;
}
