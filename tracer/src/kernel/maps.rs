//! The kernel's maps read back as plain `tracer_common` values: probe hits, latencies,
//! counters, off-CPU and task times, stacks.
//! The ring buffers and the other maps user space keeps using are taken from here.
//! The few values user space writes into maps are written here too.

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, PerCpuHashMap, RingBuf, StackTraceMap};
use tracer_common::{
    HitStackKey, KernelStack, LatencyProcessKey, LatencyStart, LatencyStartKey, LatencyStats,
    OffCpuKey, OffCpuStart, OffCpuTotal, OnCpuKey, ProbeHits, ProcessMetricKey, StackId, StackKey,
    TaskId, TaskKey, TaskName, TaskState, TaskTotal, TaskWallKey, control, counter, histogram,
    map_names, python::PythonProcess,
};

use super::{Loader, LoaderError, RecordRing, Result, SnapshotChecks, TargetsMap};

/// A probe's hits, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ProbeHitTotals {
    pub count: u64,
    /// When it first fired (CLOCK_MONOTONIC ns); `None` when it never did.
    pub first_ns: Option<u64>,
}

/// Kernel-side aggregates of one latency, summed over CPUs.
#[derive(Debug, Clone, Default)]
pub(crate) struct LatencyData {
    /// Counts per `tracer_common::histogram` bucket.
    pub buckets: Vec<u64>,
    pub stats: LatencyStats,
}

impl<Maps> Loader<Maps> {
    /// A handle on the set of target processes, to add to it and read it while the
    /// programs run (a set of processes: see [`KernelTargets`](super::KernelTargets)).
    pub(crate) fn targets_map(&self) -> Result<TargetsMap> {
        let name = map_names::TARGETS;
        match self.maps.get(name) {
            Some(Map::HashMap(data)) => TargetsMap::from_map(data),
            _ => Err(LoaderError::Missing(name)),
        }
    }

    /// Stops recording USDT hits now, in the kernel, before the slow detach: whatever
    /// fires afterwards is neither counted nor sent.
    /// Starts the wall-clock profile: the scheduler and sampling programs record from now
    /// on (see [`control::RECORDING`]).
    pub(crate) fn start_recording(&mut self) -> Result<()> {
        self.set_control(control::RECORDING, 1)
    }

    pub(crate) fn stop_recording(&mut self) -> Result<()> {
        self.set_control(control::STOPPED, 1)
    }

    /// Sets one of the `CONTROL` switches (see [`control`]).
    pub(super) fn set_control(&mut self, index: u32, value: u32) -> Result<()> {
        let name = map_names::CONTROL;
        let map = self.maps.get_mut(name).ok_or(LoaderError::Missing(name))?;
        let mut control: Array<_, u32> =
            Array::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        control
            .set(index, &value, 0)
            .map_err(|source| LoaderError::Map { name, source })
    }

    /// Takes the timeline's ring buffer ([`tracer_common::TimelineEvent`]).
    pub(crate) fn take_timeline(&mut self) -> Result<RecordRing> {
        self.take_ring(map_names::TIMELINE)
    }

    /// Takes the ring buffer that tells of processes newly recorded in `HELD` (see
    /// [`Loader::held`]): readable when there is one to look at.
    pub(crate) fn take_held_notices(&mut self) -> Result<RecordRing> {
        self.take_ring(map_names::HELD_NOTICES)
    }

    /// Tells the programs that process `tgid` runs a CPython interpreter laid out as
    /// `process` says: its snapshots carry its threads' Python frames from now on.
    pub(crate) fn add_python_process(&mut self, tgid: u32, process: &PythonProcess) -> Result<()> {
        let name = map_names::PYTHON_PROCESSES;
        let map = self.maps.get_mut(name).ok_or(LoaderError::Missing(name))?;
        let mut map: HashMap<&mut MapData, u32, PythonProcess> =
            HashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        map.insert(&tgid, process, 0)
            .map_err(|source| LoaderError::Map { name, source })?;
        self.set_control(control::PYTHON, 1)
    }

    fn array<T: aya::Pod>(&self, name: &'static str) -> Result<Array<&MapData, T>> {
        let map = self.maps.get(name).ok_or(LoaderError::Missing(name))?;
        Array::try_from(map).map_err(|source| LoaderError::Map { name, source })
    }

    fn per_cpu_array<T: aya::Pod>(&self, name: &'static str) -> Result<PerCpuArray<&MapData, T>> {
        let map = self.maps.get(name).ok_or(LoaderError::Missing(name))?;
        PerCpuArray::try_from(map).map_err(|source| LoaderError::Map { name, source })
    }

    pub(super) fn hash_map<K: aya::Pod, V: aya::Pod>(
        &self,
        name: &'static str,
    ) -> Result<HashMap<&MapData, K, V>> {
        let map = self.maps.get(name).ok_or(LoaderError::Missing(name))?;
        HashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })
    }

    /// Every entry of hash map `name`.
    /// Every entry of hash map `name`: in batches where the kernel can, else key by key.
    pub(super) fn entries<K: aya::Pod, V: aya::Pod>(
        &self,
        name: &'static str,
    ) -> Result<Vec<(K, V)>> {
        let map = self.hash_map::<K, V>(name)?;
        if let Some(Map::HashMap(data) | Map::LruHashMap(data)) = self.maps.get(name)
            && let Ok(entries) =
                super::sys::hash_entries::<K, V>(std::os::fd::AsFd::as_fd(data.fd()))
        {
            return Ok(entries);
        }
        map.iter()
            .collect::<Result<_, _>>()
            .map_err(|source| LoaderError::Map { name, source })
    }

    /// The histogram and totals of latency `latency_id`.
    pub(crate) fn latency(&self, latency_id: u32) -> Result<LatencyData> {
        let hist = self.array::<u64>(map_names::LATENCY_HIST)?;
        let stats_map = self.per_cpu_array::<LatencyStats>(map_names::LATENCY_STATS)?;
        let map_error = |name| move |source| LoaderError::Map { name, source };
        let mut data = LatencyData {
            buckets: vec![0; histogram::BUCKETS as usize],
            ..Default::default()
        };
        data.stats.min_ns = u64::MAX;
        for per_cpu in stats_map
            .get(&latency_id, 0)
            .map_err(map_error(map_names::LATENCY_STATS))?
            .iter()
        {
            if per_cpu.count == 0 {
                continue;
            }
            data.stats.count += per_cpu.count;
            data.stats.total_ns += per_cpu.total_ns;
            data.stats.min_ns = data.stats.min_ns.min(per_cpu.min_ns);
            data.stats.max_ns = data.stats.max_ns.max(per_cpu.max_ns);
        }
        if data.stats.count == 0 {
            return Ok(data);
        }
        for (bucket, slot) in data.buckets.iter_mut().enumerate() {
            let index = latency_id * histogram::BUCKETS + bucket as u32;
            *slot = hist
                .get(&index, 0)
                .map_err(map_error(map_names::LATENCY_HIST))?;
        }
        Ok(data)
    }

    /// Every process's figures for `--metrics` (with
    /// [`super::Features::process_metrics`]).
    pub(crate) fn process_metrics(&self) -> Result<Vec<(ProcessMetricKey, u64)>> {
        self.entries(map_names::PROCESS_METRICS)
    }

    /// Removes a figure of [`Loader::process_metrics`] (of a process gone).
    pub(crate) fn remove_process_metric(&mut self, key: &ProcessMetricKey) -> Result<()> {
        let name = map_names::PROCESS_METRICS;
        let map = self.maps.get_mut(name).ok_or(LoaderError::Missing(name))?;
        let mut map: HashMap<&mut MapData, ProcessMetricKey, u64> =
            HashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        map.remove(key)
            .map_err(|source| LoaderError::Map { name, source })
    }

    /// Deletes `keys` from hash map `name` (those already gone are no error).
    fn remove_keys<K: aya::Pod, V: aya::Pod>(
        &mut self,
        name: &'static str,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<()> {
        let map = self.maps.get_mut(name).ok_or(LoaderError::Missing(name))?;
        let mut map: HashMap<&mut MapData, K, V> =
            HashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        for key in keys {
            let _ = map.remove(&key);
        }
        Ok(())
    }

    /// Deletes the per-process latency totals `keys` (read and kept elsewhere).
    pub(crate) fn remove_latency_by_process(&mut self, keys: &[LatencyProcessKey]) -> Result<()> {
        let name = map_names::LATENCY_BY_PROCESS;
        let map = self.maps.get_mut(name).ok_or(LoaderError::Missing(name))?;
        let mut map: PerCpuHashMap<&mut MapData, LatencyProcessKey, LatencyStats> =
            PerCpuHashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        for key in keys {
            let _ = map.remove(key);
        }
        Ok(())
    }

    /// The totals of every latency per process: `(tgid, latency_id)` and the stats,
    /// summed over CPUs.
    pub(crate) fn latency_by_process(&self) -> Result<Vec<(LatencyProcessKey, LatencyStats)>> {
        let name = map_names::LATENCY_BY_PROCESS;
        let map = self.maps.get(name).ok_or(LoaderError::Missing(name))?;
        let map: PerCpuHashMap<&MapData, LatencyProcessKey, LatencyStats> =
            PerCpuHashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        let mut out = Vec::new();
        for entry in &map {
            let (key, per_cpu) = entry.map_err(|source| LoaderError::Map { name, source })?;
            let mut total = LatencyStats {
                min_ns: u64::MAX,
                ..LatencyStats::default()
            };
            for cpu in per_cpu.iter().filter(|cpu| cpu.count > 0) {
                total.count += cpu.count;
                total.total_ns += cpu.total_ns;
                total.min_ns = total.min_ns.min(cpu.min_ns);
                total.max_ns = total.max_ns.max(cpu.max_ns);
            }
            out.push((key, total));
        }
        out.sort_by_key(|(key, _)| (key.latency_id, key.tgid));
        Ok(out)
    }

    /// Hits counted by probe, process and stacks (`trace --count --stack`), summed over
    /// CPUs.
    pub(crate) fn hit_stacks(&self) -> Result<Vec<(HitStackKey, u64)>> {
        let name = map_names::HIT_STACKS;
        let map = self.maps.get(name).ok_or(LoaderError::Missing(name))?;
        let map: PerCpuHashMap<&MapData, HitStackKey, u64> =
            PerCpuHashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        let mut out = Vec::new();
        for entry in &map {
            let (key, per_cpu) = entry.map_err(|source| LoaderError::Map { name, source })?;
            out.push((key, per_cpu.iter().sum()));
        }
        Ok(out)
    }

    /// How often probe `probe_id` fired, and when it first did.
    pub(crate) fn probe_hits(&self, probe_id: u32) -> Result<ProbeHitTotals> {
        let name = map_names::PROBE_HITS;
        let hits = self.per_cpu_array::<ProbeHits>(name)?;
        let per_cpu = hits
            .get(&probe_id, 0)
            .map_err(|source| LoaderError::Map { name, source })?;
        Ok(per_cpu.iter().filter(|cpu| cpu.count > 0).fold(
            ProbeHitTotals::default(),
            |total, cpu| ProbeHitTotals {
                count: total.count + cpu.count,
                first_ns: Some(total.first_ns.map_or(cpu.first_ns, |t| t.min(cpu.first_ns))),
            },
        ))
    }

    /// The loss counters (`tracer_common::counter`), summed over CPUs.
    pub(crate) fn counters(&self) -> Result<[u64; counter::COUNT as usize]> {
        let name = map_names::COUNTERS;
        let map = self.per_cpu_array::<u64>(name)?;
        let mut out = [0; counter::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = map
                .get(&(i as u32), 0)
                .map_err(|source| LoaderError::Map { name, source })?
                .iter()
                .sum();
        }
        Ok(out)
    }

    /// Takes the event ring buffer (for `tracer trace`).
    pub(crate) fn take_events(&mut self) -> Result<RecordRing> {
        self.take_ring(map_names::USDT_EVENTS)
    }

    fn take_ring(&mut self, name: &'static str) -> Result<RecordRing> {
        let map = self.maps.remove(name).ok_or(LoaderError::Missing(name))?;
        RingBuf::try_from(map)
            .map(RecordRing)
            .map_err(|source| LoaderError::Map { name, source })
    }
}

/// What reads or takes the maps created on a thread of their own (`DEFERRED_MAPS`).
impl Loader {
    /// Takes the ring buffer of user stack snapshots ([`tracer_common::UnwindSample`]).
    pub(crate) fn take_unwind_samples(&mut self) -> Result<RecordRing> {
        self.take_ring(map_names::UNWIND_SAMPLES)
    }

    /// Takes the map through which user space tells the kernel how to check that an
    /// off-CPU snapshot can be reused ([`tracer_common::SnapshotCheck`] by snapshot id).
    pub(crate) fn take_snapshot_checks(&mut self) -> Result<SnapshotChecks> {
        let name = map_names::SNAPSHOT_CHECKS;
        let map = self.maps.remove(name).ok_or(LoaderError::Missing(name))?;
        HashMap::try_from(map)
            .map(SnapshotChecks)
            .map_err(|source| LoaderError::Map { name, source })
    }

    /// Marks threads as off CPU since `start.ts_ns`, for those already blocked when
    /// profiling starts; a thread's next switch out replaces its mark (so marking a thread
    /// that is running is harmless), and its next switch in accounts the time since.
    /// Entries the kernel already recorded are kept.
    pub(crate) fn seed_offcpu_starts(&mut self, starts: &[(u32, OffCpuStart)]) -> Result<()> {
        const BPF_NOEXIST: u64 = 1;
        let name = map_names::OFFCPU_STARTS;
        let map = self.maps.get_mut(name).ok_or(LoaderError::Missing(name))?;
        let mut map: HashMap<&mut MapData, u32, OffCpuStart> =
            HashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        for (tid, start) in starts {
            match map.insert(tid, start, BPF_NOEXIST) {
                Ok(()) => {}
                // Already recorded by the kernel, which knows better.
                Err(aya::maps::MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
                Err(source) => return Err(LoaderError::Map { name, source }),
            }
        }
        Ok(())
    }

    /// On-CPU sample counts per thread and stacks.
    pub(crate) fn oncpu_samples(&self) -> Result<Vec<(StackKey, u64)>> {
        let samples: Vec<(OnCpuKey, u64)> = self.entries(map_names::ONCPU_SAMPLES)?;
        Ok(samples.into_iter().map(|(k, n)| (k.into(), n)).collect())
    }

    /// Deletes off-CPU totals `keys` (read and kept elsewhere).
    pub(crate) fn remove_offcpu_totals(&mut self, keys: &[StackKey]) -> Result<()> {
        let keys = keys.iter().map(|&k| OffCpuKey::from(k));
        self.remove_keys::<OffCpuKey, OffCpuTotal>(map_names::OFFCPU_TIME, keys)
    }

    /// Deletes on-CPU sample counts `keys` (read and kept elsewhere).
    pub(crate) fn remove_oncpu_samples(&mut self, keys: &[StackKey]) -> Result<()> {
        let keys = keys.iter().map(|&k| OnCpuKey::from(k));
        self.remove_keys::<OnCpuKey, u64>(map_names::ONCPU_SAMPLES, keys)
    }

    /// Deletes what processes `tgids` and their threads `tids` left that nothing reads:
    /// their tasks' states, their Python interpreters, and the latencies their threads
    /// began before `before_ns` and never ended (a thread whose id was reused since
    /// began its own later).
    pub(crate) fn forget_processes(
        &mut self,
        tgids: &std::collections::HashSet<u32>,
        tids: &std::collections::HashSet<u32>,
        before_ns: u64,
    ) -> Result<()> {
        let states: Vec<TaskId> = self
            .task_states()?
            .into_iter()
            .map(|(id, _)| id)
            .filter(|id| tgids.contains(&id.tgid))
            .collect();
        self.remove_keys::<TaskId, TaskState>(map_names::TASK_STATES, states)?;
        let starts: Vec<LatencyStartKey> = self
            .entries::<LatencyStartKey, LatencyStart>(map_names::LATENCY_STARTS)?
            .into_iter()
            .filter(|(key, start)| tids.contains(&key.tid) && start.start_ns < before_ns)
            .map(|(key, _)| key)
            .collect();
        self.remove_keys::<LatencyStartKey, LatencyStart>(map_names::LATENCY_STARTS, starts)?;
        self.remove_keys::<u32, PythonProcess>(map_names::PYTHON_PROCESSES, tgids.iter().copied())
    }

    /// Off-CPU time accumulated per thread and stacks.
    pub(crate) fn offcpu_totals(&self) -> Result<Vec<(StackKey, OffCpuTotal)>> {
        let totals: Vec<(OffCpuKey, OffCpuTotal)> = self.entries(map_names::OFFCPU_TIME)?;
        Ok(totals.into_iter().map(|(k, t)| (k.into(), t)).collect())
    }

    /// Threads that are off CPU right now (their interval has not ended yet).
    pub(crate) fn offcpu_pending(&self) -> Result<Vec<(u32, OffCpuStart)>> {
        let mut starts: Vec<(u32, OffCpuStart)> = self.entries(map_names::OFFCPU_STARTS)?;
        starts.retain(|(_, start)| start.ts_ns != tracer_common::OFFCPU_START_ENDED);
        Ok(starts)
    }

    /// Running and parked time per runtime task.
    pub(crate) fn task_times(&self) -> Result<Vec<(TaskKey, TaskTotal)>> {
        self.entries(map_names::TASK_TIME)
    }

    /// Tasks whose interval is still open (parked or running right now).
    pub(crate) fn task_states(&self) -> Result<Vec<(TaskId, TaskState)>> {
        self.entries(map_names::TASK_STATES)
    }

    /// Threads' time while they ran a task (on-CPU samples taken by frame pointers,
    /// off-CPU intervals), by task and stacks.
    pub(crate) fn task_wall(&self) -> Result<Vec<(TaskWallKey, OffCpuTotal)>> {
        self.entries(map_names::TASK_WALL)
    }

    /// What runtimes called their tasks.
    pub(crate) fn task_names(&self) -> Result<Vec<(TaskId, TaskName)>> {
        self.entries(map_names::TASK_NAMES)
    }

    /// The instruction pointers of stack `id`, innermost first; empty when `id` is an error.
    pub(crate) fn stack(&self, id: StackId) -> Result<Vec<u64>> {
        let id = match id {
            StackId::StackMap(id) => id,
            StackId::SwitchIn(id) => return self.switch_in_stack(id),
            _ => return Ok(Vec::new()),
        };
        let name = map_names::STACKS;
        let map = self.maps.get(name).ok_or(LoaderError::Missing(name))?;
        let stacks =
            StackTraceMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        match stacks.get(&(id as u32), 0) {
            Ok(trace) => Ok(trace.frames().iter().map(|f| f.ip).collect()),
            Err(aya::maps::MapError::KeyNotFound) => Ok(Vec::new()),
            Err(source) => Err(LoaderError::Map { name, source }),
        }
    }

    /// The instruction pointers of kernel stack `id` of `KERNEL_STACKS`, innermost first.
    fn switch_in_stack(&self, id: i32) -> Result<Vec<u64>> {
        let name = map_names::KERNEL_STACKS;
        match self.hash_map::<i32, KernelStack>(name)?.get(&id, 0) {
            Ok(stack) => Ok(stack.ips[..(stack.len as usize).min(stack.ips.len())].to_vec()),
            Err(aya::maps::MapError::KeyNotFound) => Ok(Vec::new()),
            Err(source) => Err(LoaderError::Map { name, source }),
        }
    }
}
