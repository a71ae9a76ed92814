//! Latencies between a begin and an end probe: the open starts, the totals, the hits of
//! each probe.

/// Key of `LATENCY_BY_PROCESS`: one latency in one process, of one class
/// ([`NO_CLASS`](crate::NO_CLASS)
/// for latencies without classes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LatencyProcessKey {
    pub tgid: u32,
    pub latency_id: u32,
    pub class: u32,
}

/// Key of `LATENCY_STARTS`: a latency open on a thread, at a stack frame (the stack
/// pointer at a function's entry; 0 for latencies between USDT probes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LatencyStartKey {
    pub tid: u32,
    pub latency_id: u32,
    pub frame: u64,
}

/// Value of `LATENCY_STARTS`: when the latency began, and its class so far
/// ([`NO_CLASS`](crate::NO_CLASS)
/// or an argument's value, see `UsdtSite::class_arg`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyStart {
    pub start_ns: u64,
    pub class: u32,
    pub _pad: u32,
}

/// Value of `PROBE_HITS` (by probe id), per CPU: how often the probe fired and when it
/// first did on this CPU (CLOCK_MONOTONIC, like `bpf_ktime_get_ns`; 0 while `count` is 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeHits {
    pub count: u64,
    pub first_ns: u64,
}

/// Running totals of one latency, per CPU (summed in user space).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyStats {
    pub count: u64,
    pub total_ns: u64,
    /// Smallest value seen; `u64::MAX` while `count` is 0.
    pub min_ns: u64,
    pub max_ns: u64,
}
