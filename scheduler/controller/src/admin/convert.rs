//! Conversions between the scheduler core's config and the definitions `wharf admin` shows
//! and stores.

use wharf_api::admin::{
    AccountDef, AssocCaps, Associations, PartitionDef, QosDef, Source, Sourced, TresCaps,
    TresMinsCaps, UserDef,
};
use wharf_core::limits::{AssocLimits, QosLimits, TresLimit, TresMins};
use wharf_core::{
    Account, Assoc, Billing, Config, Partition, PartitionState, PreemptMode, Qos, UserShares,
};

use super::Registry;

fn tres_caps(t: &TresLimit) -> TresCaps {
    TresCaps {
        cpu: t.cpu,
        mem: t.mem,
        gpu: t.gpu,
    }
}

fn tres_limit(t: &TresCaps) -> TresLimit {
    TresLimit {
        cpu: t.cpu,
        mem: t.mem,
        gpu: t.gpu,
    }
}

fn assoc_caps(l: Option<&AssocLimits>) -> AssocCaps {
    l.map(|l| AssocCaps {
        grp_tres: tres_caps(&l.grp_tres),
        grp_jobs: l.grp_jobs,
        max_jobs: l.max_jobs,
        max_submit_jobs: l.max_submit_jobs,
        max_tres_per_job: tres_caps(&l.max_tres_per_job),
        grp_tres_mins: TresMinsCaps {
            cpu: l.grp_tres_mins.cpu,
            gpu: l.grp_tres_mins.gpu,
            billing: l.grp_tres_mins.billing,
        },
        qos: l.qos.clone(),
    })
    .unwrap_or_default()
}

fn assoc_limits(c: &AssocCaps) -> AssocLimits {
    AssocLimits {
        grp_tres: tres_limit(&c.grp_tres),
        grp_jobs: c.grp_jobs,
        max_jobs: c.max_jobs,
        max_submit_jobs: c.max_submit_jobs,
        max_tres_per_job: tres_limit(&c.max_tres_per_job),
        grp_tres_mins: TresMins {
            cpu: c.grp_tres_mins.cpu,
            gpu: c.grp_tres_mins.gpu,
            billing: c.grp_tres_mins.billing,
        },
        qos: c.qos.clone(),
    }
}

pub(crate) fn state_name(s: PartitionState) -> &'static str {
    match s {
        PartitionState::Up => "UP",
        PartitionState::Down => "DOWN",
        PartitionState::Drain => "DRAIN",
        PartitionState::Inactive => "INACTIVE",
    }
}

fn config<T>(def: T) -> Sourced<T> {
    Sourced {
        def,
        source: Source::Config,
    }
}

impl Registry {
    /// The associations of the config file alone.
    pub fn from_config(base: Config) -> Registry {
        let l = &base.limits;
        let accounts = base
            .accounts
            .iter()
            .map(|a| {
                config(AccountDef {
                    name: a.name.clone(),
                    parent: a.parent.clone(),
                    shares: a.shares,
                    limits: assoc_caps(l.accounts.get(&a.name)),
                    coordinators: vec![],
                })
            })
            .collect();
        let users = base
            .users
            .iter()
            .enumerate()
            .map(|(i, u)| {
                config(UserDef {
                    user: u.user.clone(),
                    account: u.account.clone(),
                    shares: u.shares,
                    // The first entry of a user is their default.
                    default: !base.users[..i].iter().any(|o| o.user == u.user),
                    limits: assoc_caps(l.users.get(&Assoc::new(&u.account, &u.user))),
                })
            })
            .collect();
        let qos = base
            .qos
            .iter()
            .map(|q| {
                let lim = l.qos.get(&q.name).cloned().unwrap_or_default();
                config(QosDef {
                    name: q.name.clone(),
                    priority: q.priority,
                    max_tres_per_user: tres_caps(&lim.max_tres_per_user),
                    max_jobs_per_user: lim.max_jobs_per_user,
                    max_submit_jobs_per_user: lim.max_submit_jobs_per_user,
                    max_wall: lim.max_wall.map(|ms| ms / 1000),
                    grp_tres: tres_caps(&lim.grp_tres),
                    grp_jobs: lim.grp_jobs,
                    preempt: lim.preempt.clone(),
                    preempt_mode: lim.preempt_mode.map(|m| m.as_str().to_string()),
                })
            })
            .collect();
        let partitions = base
            .partitions
            .iter()
            .map(|p| {
                config(PartitionDef {
                    name: p.name.clone(),
                    nodes: p.nodes.clone(),
                    state: state_name(p.state).into(),
                    priority_tier: p.priority_tier,
                    max_time: p.max_time.map(|ms| ms / 1000),
                    default_time: p.default_time.map(|ms| ms / 1000),
                    max_nodes: p.max_nodes,
                    def_mem_per_cpu: p.def_mem_per_cpu,
                    def_mem_per_gpu: p.def_mem_per_gpu,
                    max_mem_per_cpu: p.max_mem_per_cpu,
                    max_mem_per_gpu: p.max_mem_per_gpu,
                    billing_cpu: p.billing.cpu,
                    billing_memory_gib: p.billing.memory_gib,
                    billing_gpu: p.billing.gpu,
                    default: base.default_partition.as_deref() == Some(p.name.as_str()),
                    preempt_mode: Some(p.preempt_mode.as_str().to_string()),
                    allow_accounts: p.allow_accounts.clone(),
                    allow_groups: p.allow_groups.clone(),
                })
            })
            .collect();
        Registry {
            assocs: Associations {
                accounts,
                users,
                qos,
                partitions,
            },
            base,
        }
    }

    /// The scheduler's config: the file's policy and weights with these associations.
    pub fn config(&self) -> Config {
        let mut c = self.base.clone();
        let a = &self.assocs;
        c.accounts = a
            .accounts
            .iter()
            .map(|e| Account {
                name: e.def.name.clone(),
                parent: e.def.parent.clone(),
                shares: e.def.shares,
            })
            .collect();
        c.limits.accounts = a
            .accounts
            .iter()
            .filter(|e| e.def.limits != AssocCaps::default())
            .map(|e| (e.def.name.clone(), assoc_limits(&e.def.limits)))
            .collect();
        // The core takes a user's first entry as their default.
        let mut users: Vec<&UserDef> = a.users.iter().map(|e| &e.def).collect();
        users.sort_by_key(|u| !u.default);
        c.users = users
            .iter()
            .map(|u| UserShares {
                user: u.user.clone(),
                account: u.account.clone(),
                shares: u.shares,
            })
            .collect();
        c.limits.users = users
            .iter()
            .filter(|u| u.limits != AssocCaps::default())
            .map(|u| (Assoc::new(&u.account, &u.user), assoc_limits(&u.limits)))
            .collect();
        c.qos = a
            .qos
            .iter()
            .map(|e| Qos {
                name: e.def.name.clone(),
                priority: e.def.priority,
            })
            .collect();
        c.limits.qos = a
            .qos
            .iter()
            .map(|e| {
                let q = &e.def;
                let l = QosLimits {
                    max_tres_per_user: tres_limit(&q.max_tres_per_user),
                    max_jobs_per_user: q.max_jobs_per_user,
                    max_submit_jobs_per_user: q.max_submit_jobs_per_user,
                    max_wall: q.max_wall.map(|s| s.saturating_mul(1000)),
                    grp_tres: tres_limit(&q.grp_tres),
                    grp_jobs: q.grp_jobs,
                    preempt: q.preempt.clone(),
                    preempt_mode: q.preempt_mode.as_deref().and_then(PreemptMode::parse),
                };
                (q.name.clone(), l)
            })
            .filter(|(_, l)| *l != QosLimits::default())
            .collect();
        c.partitions = a
            .partitions
            .iter()
            .map(|e| self.partition(&e.def))
            .collect();
        c.default_partition = a
            .partitions
            .iter()
            .find(|e| e.def.default)
            .map(|e| e.def.name.clone());
        c
    }

    /// A partition for the core: the file's of that name (so settings `wharf admin` does not
    /// manage stay as the file sets them), with the definition's settings over it.
    fn partition(&self, d: &PartitionDef) -> Partition {
        let mut p = self
            .base
            .partitions
            .iter()
            .find(|p| p.name == d.name)
            .cloned()
            .unwrap_or_else(|| Partition::new(&d.name, &[]));
        p.nodes = d.nodes.clone();
        p.state = match d.state.as_str() {
            "DOWN" => PartitionState::Down,
            "DRAIN" => PartitionState::Drain,
            "INACTIVE" => PartitionState::Inactive,
            _ => PartitionState::Up,
        };
        p.priority_tier = d.priority_tier;
        p.max_time = d.max_time.map(|s| s.saturating_mul(1000));
        p.default_time = d.default_time.map(|s| s.saturating_mul(1000));
        p.max_nodes = d.max_nodes;
        p.def_mem_per_cpu = d.def_mem_per_cpu;
        p.def_mem_per_gpu = d.def_mem_per_gpu;
        p.max_mem_per_cpu = d.max_mem_per_cpu;
        p.max_mem_per_gpu = d.max_mem_per_gpu;
        p.billing = Billing {
            cpu: d.billing_cpu,
            memory_gib: d.billing_memory_gib,
            gpu: d.billing_gpu,
        };
        p.preempt_mode = d
            .preempt_mode
            .as_deref()
            .and_then(PreemptMode::parse)
            .unwrap_or_default();
        p.allow_accounts = d.allow_accounts.clone();
        p.allow_groups = d.allow_groups.clone();
        p
    }
}
