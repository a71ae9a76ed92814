//! What the kernel does at one site: the `UsdtSite` a site becomes, and where its uprobe goes.
//! A site's roles are the parts it takes in the latencies and tasks measured.
//! Its flags, task arguments, latency fields and class follow from its roles and arguments.
//! Its probe id and argument specs are filled in once its probe has an id.

use tracer_common::{MAX_LATENCIES_PER_PROBE, MAX_USDT_ARGS, TASK_IS_THREAD, UsdtSite, site_flags};

use super::{PlanError, SiteInput, UnavailableArg};
use crate::{
    kernel::UsdtAttachment,
    probe::runtimes::{ClassValue, LatencyDef, TaskProbeDef, TaskRole},
    probe::usdt::{ProbeKind, SiteArg},
};

/// The parts a site takes in the latencies and tasks measured.
pub(super) struct SiteRoles<'a> {
    /// Ids of the latencies it begins.
    begins: Vec<u32>,
    /// Ids of the latencies it ends.
    ends: Vec<u32>,
    /// The latency open on its thread that it classifies, and with what.
    classifies: Option<(usize, ClassValue)>,
    task: Option<&'a TaskProbeDef>,
}

impl<'a> SiteRoles<'a> {
    pub(super) fn of(
        input: &SiteInput,
        latencies: &[LatencyDef],
        tasks: &'a [TaskProbeDef],
    ) -> Self {
        let roles = |pick: fn(&LatencyDef) -> &crate::probe::runtimes::ProbeRef| -> Vec<u32> {
            latencies
                .iter()
                .enumerate()
                .filter(|(_, l)| pick(l).is(input.kind, &input.provider, &input.name))
                .map(|(i, _)| i as u32)
                .collect()
        };
        // A probe that classifies a latency open on its thread (V8's collector).
        let classifies = latencies.iter().enumerate().find_map(|(i, l)| {
            let probes = l.class.as_ref().map_or(&[][..], |c| c.probes.as_slice());
            probes
                .iter()
                .find(|(probe, _)| probe.is(input.kind, &input.provider, &input.name))
                .map(|(_, value)| (i, *value))
        });
        let task = (input.kind == ProbeKind::Usdt)
            .then(|| {
                tasks
                    .iter()
                    .find(|t| t.provider == input.provider && t.name == input.name)
            })
            .flatten();
        Self {
            begins: roles(|l| &l.begin),
            ends: roles(|l| &l.end),
            classifies,
            task,
        }
    }

    /// It takes no part: `attach` leaves it out.
    pub(super) fn is_none(&self) -> bool {
        self.begins.is_empty()
            && self.ends.is_empty()
            && self.classifies.is_none()
            && self.task.is_none()
    }
}

/// What the kernel does at one site, as its roles and arguments tell it, before its probe
/// has an id.
pub(super) struct SiteShape<'i> {
    /// The site's argument specs: none when they could not be decoded and nothing needs
    /// them.
    pub(super) args: &'i [SiteArg],
    /// Every field but the probe id, the argument specs and which are unavailable.
    site: UsdtSite,
    /// A class of the probe's own, for the last argument slot.
    class_constant: Option<u32>,
}

impl<'i> SiteShape<'i> {
    /// The shape of the site `input`, which takes the parts `roles` in `latencies`; with
    /// `emit_events`, its hits become events.
    pub(super) fn of(
        input: &'i SiteInput,
        roles: SiteRoles<'_>,
        latencies: &[LatencyDef],
        emit_events: bool,
    ) -> Result<Self, PlanError> {
        let SiteRoles {
            begins,
            ends,
            classifies,
            task,
        } = roles;
        if begins.len() > MAX_LATENCIES_PER_PROBE || ends.len() > MAX_LATENCIES_PER_PROBE {
            return Err(PlanError::TooManyRoles(probe_label(input)));
        }
        let args = site_args(input, task, emit_events)?;
        let task_fields = TaskFields::of(input, task, args)?;
        let event_flag = if emit_events {
            site_flags::EMIT_EVENT
        } else {
            0
        };
        let return_flag = match input.kind {
            ProbeKind::Uretprobe => site_flags::RETURN_PROBE,
            _ => 0,
        };
        let class = ClassFields::of(classifies, &begins, latencies);
        class.check_arg(input, args)?;
        let mut site = UsdtSite {
            arg_count: args.len().min(MAX_USDT_ARGS) as u8,
            flags: event_flag | task_fields.flag | return_flag,
            task_arg: task_fields.task_arg,
            task_name_arg: task_fields.name_arg,
            latency_begin_count: begins.len() as u8,
            latency_end_count: ends.len() as u8,
            latency_frames: latency_frames(&begins, &ends, latencies),
            class_arg: class.arg,
            class_latency: class.latency,
            latency_innermost: latency_innermost(&begins, latencies),
            ..Default::default()
        };
        site.latency_begins[..begins.len()].copy_from_slice(&begins);
        site.latency_ends[..ends.len()].copy_from_slice(&ends);
        Ok(Self {
            args,
            site,
            class_constant: class.constant,
        })
    }

    /// The site as a site of probe `probe_id`, its argument specs filled in; and the
    /// arguments it cannot read, in order.
    pub(super) fn into_site(self, probe_id: u32) -> (UsdtSite, Vec<UnavailableArg>) {
        let SiteShape {
            args,
            mut site,
            class_constant,
        } = self;
        site.probe_id = probe_id;
        let mut unavailable_args = Vec::new();
        for (i, arg) in args.iter().take(MAX_USDT_ARGS).enumerate() {
            match arg {
                Ok(arg) => site.args[i] = *arg,
                Err(why) => {
                    // Kind 0 reads as 0; the bit tells user space it means nothing.
                    site.unavailable |= 1 << i;
                    unavailable_args.push(UnavailableArg {
                        probe_id,
                        index: i,
                        reason: why.clone(),
                    });
                }
            }
        }
        if let Some(class) = class_constant {
            site.args[MAX_USDT_ARGS - 1] = tracer_common::UsdtArg {
                kind: tracer_common::arg_kind::CONST,
                val_off: class.into(),
                size: 4,
                ..Default::default()
            };
        }
        (site, unavailable_args)
    }
}

/// Where the uprobe of the site `input` goes, for process `pid` (or every process when
/// `None`).
pub(super) fn attachment(input: &SiteInput, pid: Option<u32>) -> UsdtAttachment {
    UsdtAttachment {
        path: input.attach_path.clone(),
        offset: input.file_offset,
        semaphore_offset: input.semaphore_offset,
        pid,
        ret: input.kind == ProbeKind::Uretprobe,
    }
}

/// How errors name the probe of the site `input`.
fn probe_label(input: &SiteInput) -> String {
    match input.kind {
        ProbeKind::Usdt => {
            format!("{}:{}:{}", input.path.display(), input.provider, input.name)
        }
        kind => format!("{kind}:{}:{}", input.path.display(), input.name),
    }
}

/// The argument specs of the site `input`, which is a site of the task probe `task`, if
/// any.
fn site_args<'i>(
    input: &'i SiteInput,
    task: Option<&TaskProbeDef>,
    emit_events: bool,
) -> Result<&'i [SiteArg], PlanError> {
    // Arguments matter only for events and task ids; a latency probe with an odd
    // spec still works.
    let args: &[SiteArg] = match (&input.args, emit_events) {
        (Ok(args), _) => args,
        (Err(reason), _) if emit_events || task.is_some_and(|t| t.task_arg.is_some()) => {
            return Err(PlanError::BadArguments {
                probe: probe_label(input),
                reason: reason.clone(),
            });
        }
        (Err(_), _) => &[],
    };
    Ok(args)
}

/// What a site tells the kernel of the task it switches: the flag of its role, the
/// argument holding the task's name, and the one holding the task's id.
struct TaskFields {
    flag: u8,
    name_arg: u8,
    /// [`TASK_IS_THREAD`] when the task is the thread that hits the site.
    task_arg: u8,
}

impl TaskFields {
    /// The task fields of the site `input` with the argument specs `args`, which is a
    /// site of the task probe `task`, if any.
    fn of(
        input: &SiteInput,
        task: Option<&TaskProbeDef>,
        args: &[SiteArg],
    ) -> Result<Self, PlanError> {
        let flag = match task.map(|t| t.role) {
            Some(TaskRole::Run) => site_flags::TASK_RUN,
            Some(TaskRole::Pause) => site_flags::TASK_PAUSE,
            Some(TaskRole::Finish) => site_flags::TASK_FINISH,
            Some(TaskRole::Name { .. }) => site_flags::TASK_NAME,
            None => 0,
        };
        let name_arg = match task.map(|t| t.role) {
            Some(TaskRole::Name { name_arg }) => name_arg,
            _ => 0,
        };
        let task_arg = match task.and_then(|t| t.task_arg) {
            Some(index) => match args.get(index as usize) {
                Some(Ok(_)) => index,
                Some(Err(why)) => {
                    return Err(PlanError::BadArguments {
                        probe: probe_label(input),
                        reason: format!("the task argument is unavailable: {why}"),
                    });
                }
                None => {
                    let reason = "the task probe has no task argument".into();
                    return Err(PlanError::BadArguments {
                        probe: probe_label(input),
                        reason,
                    });
                }
            },
            None => TASK_IS_THREAD,
        };
        Ok(Self {
            flag,
            name_arg,
            task_arg,
        })
    }
}

/// Bit `i`: the latency `begins[i]` is frame-keyed; bit `4 + i`: so is `ends[i]`.
fn latency_frames(begins: &[u32], ends: &[u32], latencies: &[LatencyDef]) -> u8 {
    let mut latency_frames = 0u8;
    for (i, &id) in begins.iter().enumerate() {
        if latencies[id as usize].frame_keyed {
            latency_frames |= 1 << i;
        }
    }
    for (i, &id) in ends.iter().enumerate() {
        if latencies[id as usize].frame_keyed {
            latency_frames |= 16 << i;
        }
    }
    latency_frames
}

/// How a site classifies latencies, as the `UsdtSite` fields of the same names say.
struct ClassFields {
    /// 1 + the index of the argument that gives the class, 0 for none.
    arg: u8,
    /// 1 + the id of the open latency classified, 0 for none.
    latency: u8,
    /// A class of the probe's own.
    constant: Option<u32>,
}

impl ClassFields {
    /// The class fields of a site that begins the latencies `begins` and classifies the
    /// open latency `classifies`, if any.
    fn of(
        classifies: Option<(usize, ClassValue)>,
        begins: &[u32],
        latencies: &[LatencyDef],
    ) -> Self {
        // The argument that classifies what this site begins, or the open latency it
        // classifies; 1 + the index, 0 for none.
        let begin_class = begins.iter().find_map(|&id| {
            latencies[id as usize]
                .class
                .as_ref()
                .and_then(|c| c.begin_arg)
        });
        // A class of the probe's own is a constant in the last argument slot, past
        // those events show.
        let mut class_constant = None;
        let (class_arg, class_latency) = match (classifies, begin_class) {
            (Some((latency, value)), _) => {
                let innermost = match latencies[latency].frame_keyed {
                    true => tracer_common::CLASSIFIES_INNERMOST,
                    false => 0,
                };
                let arg = match value {
                    ClassValue::Arg(arg) => arg,
                    ClassValue::Const(class) => {
                        class_constant = Some(class);
                        MAX_USDT_ARGS as u8 - 1
                    }
                };
                (arg + 1, (latency as u8 + 1) | innermost)
            }
            (None, Some(arg)) => (arg + 1, 0),
            (None, None) => (0, 0),
        };
        Self {
            arg: class_arg,
            latency: class_latency,
            constant: class_constant,
        }
    }

    /// Fails when the argument that gives the class is one the site `input`, with the
    /// argument specs `args`, lacks or cannot read.
    fn check_arg(&self, input: &SiteInput, args: &[SiteArg]) -> Result<(), PlanError> {
        if self.constant.is_none()
            && self.arg > 0
            && !matches!(args.get(self.arg as usize - 1), Some(Ok(_)))
        {
            return Err(PlanError::BadArguments {
                probe: probe_label(input),
                reason: format!(
                    "arg{} classifies a latency, and the probe does not have it",
                    self.arg - 1
                ),
            });
        }
        Ok(())
    }
}

/// Bit `i`: `begins[i]` notes its frame as its latency's innermost call open on the
/// thread.
fn latency_innermost(begins: &[u32], latencies: &[LatencyDef]) -> u8 {
    // Begins of frame-keyed latencies another probe classifies note their frame.
    let mut latency_innermost = 0u8;
    for (i, &id) in begins.iter().enumerate() {
        let latency = &latencies[id as usize];
        if latency.frame_keyed && latency.class.as_ref().is_some_and(|c| !c.probes.is_empty()) {
            latency_innermost |= 1 << i;
        }
    }
    latency_innermost
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::UsdtArg;

    use super::super::{ProbePlan, SiteMode, tests::site};

    fn latency(name: &str, begin: &str, end: &str) -> LatencyDef {
        LatencyDef::between(
            name.into(),
            crate::probe::runtimes::ProbeRef::usdt("tracer", begin),
            crate::probe::runtimes::ProbeRef::usdt("tracer", end),
        )
    }

    #[test]
    fn assigns_latency_roles_per_site() {
        let sites = [
            site("gc__begin", 1),
            site("gc__stop_the_world", 2),
            site("gc__end", 3),
            site("gc__end", 4),
            site("other", 5),
        ];
        let lats = [
            latency("pause", "gc__begin", "gc__end"),
            latency("stw", "gc__begin", "gc__stop_the_world"),
        ];
        let plan = ProbePlan::build(&sites, &lats, &[], SiteMode::LatenciesOnly, Some(7)).unwrap();
        assert_eq!(plan.sites.len(), 4, "the unrelated probe is not attached");
        let begin = &plan.sites[0].site;
        assert_eq!(
            (begin.latency_begin_count, &begin.latency_begins[..2]),
            (2, &[0, 1][..])
        );
        assert_eq!(plan.sites[1].site.latency_ends[..1], [1]);
        assert_eq!(
            plan.sites[2].site.probe_id, plan.sites[3].site.probe_id,
            "two sites, one probe"
        );
        assert_eq!(
            plan.probes[plan.sites[2].site.probe_id as usize].site_count,
            2
        );
        assert_eq!(plan.sites[0].site.flags, 0);
        assert_eq!(plan.sites[0].attachment.pid, Some(7));
        assert_eq!(plan.sites[0].attachment.semaphore_offset, Some(0x40));
    }

    #[test]
    fn task_probes_get_their_role_and_task_argument() {
        let sites = [
            site("rt__run__task", 1),
            site("rt__pause__task", 2),
            site("unrelated", 3),
        ];
        let tasks: Vec<_> = crate::probe::runtimes::by_provider("tracer")
            .unwrap()
            .task_probe_defs()
            .collect();
        let plan = ProbePlan::build(&sites, &[], &tasks, SiteMode::LatenciesOnly, None).unwrap();
        assert_eq!(plan.sites.len(), 2);
        assert_eq!(plan.sites[0].site.flags, site_flags::TASK_RUN);
        assert_eq!(plan.sites[1].site.flags, site_flags::TASK_PAUSE);
        assert_eq!(plan.sites[0].site.task_arg, 0);
        let thread_tasks = [TaskProbeDef {
            provider: "tracer".into(),
            name: "rt__run__task".into(),
            role: TaskRole::Run,
            task_arg: None,
        }];
        let plan = ProbePlan::build(
            &sites[..1],
            &[],
            &thread_tasks,
            SiteMode::LatenciesOnly,
            None,
        )
        .unwrap();
        assert_eq!(plan.sites[0].site.task_arg, TASK_IS_THREAD);
    }

    #[test]
    fn events_attach_every_site_with_args() {
        let sites = [site("a", 1), site("b", 2)];
        let plan = ProbePlan::build(&sites, &[], &[], SiteMode::Events, None).unwrap();
        assert_eq!(plan.sites.len(), 2);
        assert!(
            plan.sites
                .iter()
                .all(|s| s.site.flags & site_flags::EMIT_EVENT != 0 && s.site.arg_count == 1)
        );
        assert_eq!(plan.probes[1].specifier(), "usdt:/app:tracer:b");
    }

    #[test]
    fn bad_args_fail_only_when_events_need_them() {
        let mut bad = site("gc__begin", 1);
        bad.args = Err("bad spec".into());
        let lats = [latency("pause", "gc__begin", "gc__end")];
        assert!(
            ProbePlan::build(
                std::slice::from_ref(&bad),
                &lats,
                &[],
                SiteMode::LatenciesOnly,
                None
            )
            .is_ok()
        );
        let err = ProbePlan::build(&[bad.clone()], &[], &[], SiteMode::Events, None).unwrap_err();
        assert!(matches!(err, PlanError::BadArguments { .. }));
        let counted = ProbePlan::build(&[bad], &[], &[], SiteMode::Count, None).unwrap();
        assert_eq!(counted.sites.len(), 1, "counting needs no arguments");
        assert_eq!(counted.sites[0].site.flags, 0);
    }

    #[test]
    fn an_unavailable_argument_is_marked_and_reported_once_per_probe() {
        let mut a = site("a", 1);
        let reg = |size| {
            Ok(UsdtArg {
                kind: tracer_common::arg_kind::REG,
                reg_off: 112,
                size,
                ..Default::default()
            })
        };
        a.args = Ok(vec![reg(4), Err("\"4f@%xmm0\": no".into()), reg(8)]);
        let mut a2 = a.clone();
        a2.file_offset = 2;
        let plan = ProbePlan::build(&[a.clone(), a2], &[], &[], SiteMode::Events, None).unwrap();
        assert_eq!(plan.sites.len(), 2, "the probe is attached at every site");
        for planned in &plan.sites {
            assert_eq!(planned.site.arg_count, 3);
            assert_eq!(planned.site.unavailable, 0b010);
            assert_eq!(planned.site.args[1], UsdtArg::default(), "reads as 0");
            assert_eq!(planned.site.args[2].size, 8);
        }
        assert_eq!(
            plan.unavailable_args,
            vec![UnavailableArg {
                probe_id: 0,
                index: 1,
                reason: "\"4f@%xmm0\": no".into()
            }]
        );
        // A task probe whose task argument is unavailable cannot say which task runs.
        let tasks = [TaskProbeDef {
            provider: "tracer".into(),
            name: "a".into(),
            role: TaskRole::Run,
            task_arg: Some(1),
        }];
        let err = ProbePlan::build(&[a], &[], &tasks, SiteMode::LatenciesOnly, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "probe /app:tracer:a: the task argument is unavailable: \"4f@%xmm0\": no"
        );
    }
}
