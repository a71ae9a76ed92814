//! A launch: what a run starts before its programs load, each on a thread of its own, so
//! that the time it takes passes while the targets are scanned.
//! [`Launch::load`] takes it all and gives the [`Loader`].

use std::{io, path::Path, thread::JoinHandle};

use super::{
    Loader, MapsPending, Result, Settings,
    btf::{Btf, BtfError},
    keeper::LinkKeeper,
    load::{
        EBPF_OBJECT, KERNEL_BTF, KERNEL_FUNCTIONS_USED, KERNEL_STRUCTS_USED, KERNEL_TYPEDEFS_USED,
    },
    object::Parsing,
    warm_up::UprobeWarmUp,
};

/// What a run needs started early.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LaunchNeeds {
    /// It attaches USDT sites: the uprobe warm-up and the link keeper.
    pub usdt_sites: bool,
    /// It reads kernel types (off-CPU accounting, following processes, Python frames).
    pub kernel_types: bool,
}

/// The head starts of a run, taken by [`Launch::load`]. A launch with none
/// ([`Launch::default`]) does everything at the load.
#[derive(Default)]
pub(crate) struct Launch {
    /// The uprobes that start the kernel's first wait (see [`Loader::warm_up_uprobes`]).
    pub(super) warm_up: Option<UprobeWarmUp>,
    /// The link keeper being spawned.
    pub(super) keeper: Option<JoinHandle<io::Result<LinkKeeper>>>,
    /// The kernel's BTF being read.
    pub(super) kernel_btf: Option<KernelBtfReading>,
    /// The embedded object being parsed.
    pub(super) object: Option<Parsing>,
}

/// A thread reading the kernel's BTF.
pub(super) type KernelBtfReading = JoinHandle<std::result::Result<Btf, BtfError>>;

impl Launch {
    /// Starts what `needs` asks for: call it first thing (after forking a command). The
    /// warm-up goes first, before the other threads take the CPUs: the first uprobe's
    /// wait is the longest step of a launch. Then the keeper, whose spawn waits for the
    /// exec of tracer's own binary; then the object and the kernel types.
    pub(crate) fn start(needs: LaunchNeeds) -> Self {
        let mut launch = Self::default();
        if needs.usdt_sites {
            launch.warm_up = Some(Loader::<MapsPending>::warm_up_uprobes());
            launch.keeper = Some(std::thread::spawn(LinkKeeper::spawn));
        }
        launch.object = Some(std::thread::spawn(|| aya_obj::Object::parse(EBPF_OBJECT)));
        if needs.kernel_types {
            launch.kernel_btf = Some(std::thread::spawn(|| {
                let btf = Btf::read(Path::new(KERNEL_BTF))?;
                // Only a head start: what fails here fails again, and is reported, where
                // the load looks the type up itself (only if it needs it).
                let _ = btf.look_up_at_once(
                    &KERNEL_STRUCTS_USED,
                    &KERNEL_TYPEDEFS_USED,
                    &KERNEL_FUNCTIONS_USED,
                );
                Ok(btf)
            }));
        }
        launch
    }

    /// Loads the eBPF object with `settings`, taking what was started (see
    /// [`Loader::load`]).
    pub(crate) fn load(self, settings: &Settings) -> Result<Loader<MapsPending>> {
        Loader::load_launched(settings, self)
    }
}

/// What `handle`'s thread returned; its panic goes on here.
pub(super) fn joined<T>(handle: JoinHandle<T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}
