//! The maps user space keeps reading and writing while a run lasts, wrapped so that no aya
//! type leaves the loader.

use std::os::fd::{AsRawFd, RawFd};

use aya::maps::{HashMap, MapData, RingBuf};
use tracer_common::{SnapshotCheck, StackId};

use super::{LoaderError, Result};

/// A ring buffer the eBPF side fills with records (USDT events, stack snapshots).
pub(crate) struct RecordRing(pub(super) RingBuf<MapData>);

impl RecordRing {
    /// Hands every record waiting now to `each`, in order; returns how many there were.
    pub(crate) fn drain(&mut self, mut each: impl FnMut(&[u8])) -> u64 {
        let mut count = 0;
        while let Some(record) = self.0.next() {
            each(&record);
            count += 1;
        }
        count
    }

    /// The ring, for a tokio loop to wait until records are there.
    pub(crate) fn into_async(self) -> std::io::Result<tokio::io::unix::AsyncFd<RecordRing>> {
        // SAFETY: the ring buffer owns its map fd, which stays open (and the same) as long
        // as the AsyncFd holds the ring buffer.
        unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(self, tokio::io::Interest::READABLE)
        }
        .map_err(std::io::Error::from)
    }

    /// What wakes a tokio loop when the kernel asks for the ring to be read: only for
    /// records it sends with `BPF_RB_FORCE_WAKEUP`, if it sends the rest with
    /// `BPF_RB_NO_WAKEUP`.
    pub(crate) fn wakeups(&self) -> std::io::Result<RingWakeups> {
        use std::os::fd::AsFd as _;
        // A second descriptor of the same ring: epoll watches the ring, not the number.
        let fd = self.0.as_fd().try_clone_to_owned()?;
        // SAFETY: the AsyncFd owns the descriptor, which stays open as long as it does.
        unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        }
        .map(RingWakeups)
        .map_err(std::io::Error::from)
    }
}

/// The wakeups of a ring buffer the eBPF side sends when user space is to read it.
pub(crate) struct RingWakeups(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>);

impl RingWakeups {
    /// Waits for the next wakeup since the last one.
    pub(crate) async fn wait(&mut self) -> std::io::Result<()> {
        let mut guard = self.0.readable_mut().await?;
        guard.clear_ready();
        Ok(())
    }
}

/// Readable when records wait: for `tokio::io::unix::AsyncFd`.
impl AsRawFd for RecordRing {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Where user space tells the kernel how to check that an off-CPU stack snapshot can be
/// reused ([`SnapshotCheck`] by snapshot id).
pub(crate) struct SnapshotChecks(pub(super) HashMap<MapData, i32, SnapshotCheck>);

impl SnapshotChecks {
    /// Takes snapshots `ids` out: the kernel does not reuse them.
    pub(crate) fn remove(&mut self, ids: &std::collections::HashSet<StackId>) {
        for id in ids {
            let _ = self.0.remove(&id.raw());
        }
    }

    /// Publishes the check of each snapshot of `checks` (by snapshot id): in one call
    /// where the kernel can, else one by one.
    pub(crate) fn publish(&mut self, checks: &[(StackId, SnapshotCheck)]) -> Result<()> {
        use aya::maps::IterableMap as _;
        use std::os::fd::AsFd as _;
        let ids: Vec<i32> = checks.iter().map(|(id, _)| id.raw()).collect();
        let values: Vec<SnapshotCheck> = checks.iter().map(|(_, check)| *check).collect();
        if super::sys::hash_update(self.0.map().fd().as_fd(), &ids, &values).is_ok() {
            return Ok(());
        }
        for (id, check) in checks {
            self.0
                .insert(&id.raw(), check, 0)
                .map_err(|source| LoaderError::Map {
                    name: tracer_common::map_names::SNAPSHOT_CHECKS,
                    source,
                })?;
        }
        Ok(())
    }
}
