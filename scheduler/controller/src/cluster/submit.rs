//! Submits, alone or in groups. A group is checked submit by submit against the cluster and
//! the submits before it in the group, stored in one transaction (one sync makes every one of
//! them durable), and each submit gets its own answer: a refused or failed one fails alone.

use std::collections::BTreeMap;

use wharf_api::wire::{ErrorKind, RegistryCredential, SubmitRequest};
use wharf_api::{JobId, JobRecord};
use wharf_core::Assoc;

use super::{Caller, Cluster, Failure};

/// What becomes of one submit of a group.
enum Staged {
    /// Answered without storing anything (refused, or a retry of a stored submit).
    Done(Result<JobId, Failure>),
    /// To be stored: its records (one, or one per array task) and client token.
    Insert(Vec<JobRecord>, Option<String>),
    /// A retry of the submit at this index of the group (the same client token): its answer.
    SameAs(usize),
}

/// What the submits before one in its group already add.
#[derive(Default)]
struct Added<'a> {
    /// Pending jobs per uid.
    pending: BTreeMap<u32, usize>,
    /// Client token -> (uid, index in the group).
    tokens: BTreeMap<&'a str, (u32, usize)>,
    /// (association, QoS) of each job, kept only when limits are configured.
    limited: Vec<(Assoc, Option<String>)>,
}

impl Cluster {
    /// Validates and stores a job. Returns its id once committed.
    pub fn submit(
        &mut self,
        caller: &Caller,
        req: &SubmitRequest,
        now: u64,
    ) -> Result<JobId, Failure> {
        self.submit_group(&[(caller, req)], now)
            .pop()
            .unwrap_or_else(|| Err(Failure::new(ErrorKind::Internal, "no answer to a submit")))
    }

    /// Validates and stores a group of submits in one transaction; returns each one's answer,
    /// in order, once the group is committed. Each submit is checked as if the ones before it
    /// were already stored (a user's pending count includes them).
    pub fn submit_group(
        &mut self,
        group: &[(&Caller, &SubmitRequest)],
        now: u64,
    ) -> Vec<Result<JobId, Failure>> {
        let mut added = Added::default();
        let mut staged = Vec::with_capacity(group.len());
        for (at, (caller, req)) in group.iter().enumerate() {
            let s = self
                .stage(caller, req, now, &mut added, at)
                .unwrap_or_else(|f| Staged::Done(Err(f)));
            staged.push(s);
        }
        let mut rows: Vec<(&mut [JobRecord], Option<&str>)> = staged
            .iter_mut()
            .filter_map(|s| match s {
                Staged::Insert(records, token) => Some((records.as_mut_slice(), token.as_deref())),
                _ => None,
            })
            .collect();
        let rows_n = rows.len();
        let stored: Vec<Result<bool, Failure>> = match self.store.insert_group(&mut rows) {
            Ok(each) => each.into_iter().map(|r| r.map_err(Failure::from)).collect(),
            Err(e) => vec![Err(Failure::from(e)); rows_n],
        };
        drop(rows);
        let mut stored = stored.into_iter();
        let mut answers: Vec<Result<JobId, Failure>> = Vec::with_capacity(group.len());
        for (s, (_, req)) in staged.into_iter().zip(group) {
            let answer = match s {
                Staged::Done(answer) => answer,
                Staged::SameAs(at) => answers[at].clone(),
                Staged::Insert(records, _) => match stored.next() {
                    Some(Ok(inserted)) => {
                        let id = records.first().map_or(0, |r| r.id);
                        if inserted {
                            if let Some(cred) = &req.registry_auth {
                                self.keep_credential(&records, cred);
                            }
                            records.into_iter().for_each(|r| self.jobs.insert(r));
                        }
                        Ok(id)
                    }
                    Some(Err(f)) => Err(f),
                    None => Err(Failure::new(ErrorKind::Internal, "a submit was not stored")),
                },
            };
            answers.push(answer);
        }
        answers
    }

    /// Checks one submit of a group (the `at`th) and makes its records.
    fn stage<'a>(
        &self,
        caller: &Caller,
        req: &'a SubmitRequest,
        now: u64,
        added: &mut Added<'a>,
        at: usize,
    ) -> Result<Staged, Failure> {
        let uid = caller.owner.uid;
        let in_use = || {
            Failure::new(
                ErrorKind::InvalidInput,
                "client_token is already in use; choose a new random token",
            )
        };
        if let Some(t) = &req.client_token {
            if t.is_empty() || t.len() > 128 {
                return Err(Failure::new(
                    ErrorKind::InvalidInput,
                    "client_token must be 1 to 128 characters",
                ));
            }
            // A retry of a submit that was stored: the same answer, whatever changed since.
            match self.store.job_by_token(t)? {
                Some((id, owner)) if owner == uid => return Ok(Staged::Done(Ok(id))),
                Some(_) => return Err(in_use()),
                None => {}
            }
            match added.tokens.get(t.as_str()) {
                Some(&(owner, first)) if owner == uid => return Ok(Staged::SameAs(first)),
                Some(_) => return Err(in_use()),
                None => {}
            }
        }
        let records = self.check_submit(caller, req, now, added)?;
        *added.pending.entry(uid).or_default() += records.len();
        if !self.sched.limits.is_empty() {
            let of = |r: &JobRecord| (self.assoc(r), self.qos_of(r.spec.as_ref()));
            added.limited.extend(records.iter().map(of));
        }
        if let Some(t) = &req.client_token {
            added.tokens.insert(t, (uid, at));
        }
        Ok(Staged::Insert(records, req.client_token.clone()))
    }

    /// Checks a submit against the cluster and what the submits before it in its group add,
    /// and makes its records: one, or one per array task.
    fn check_submit(
        &self,
        caller: &Caller,
        req: &SubmitRequest,
        now: u64,
        earlier: &Added,
    ) -> Result<Vec<JobRecord>, Failure> {
        let mut spec = req
            .job
            .resolve(&req.cwd, &self.defaults)
            .map_err(|m| Failure::new(ErrorKind::InvalidInput, m))?;
        spec.qos_by_admin = caller.admin && spec.qos.is_some();
        self.fix_defaults(&mut spec, &caller.owner.user);
        self.partition_defaults(&mut spec)?;
        wharf_api::limits::fits_some_node(
            &spec.resources,
            self.nodes.values().map(|n| n.info.capacity()),
        )
        .map_err(|m| Failure::new(ErrorKind::InvalidInput, m))?;
        // A node list naming nodes that are not there says so before its node count (raised
        // to theirs) is held against its partition's; a GPU type no node has says which types
        // there are; then what the partition's nodes could hold.
        let nodes = self.node_checks(&spec, &caller.owner.user);
        nodes.selection?;
        self.check_partition(&spec, caller)?;
        self.check_gpu_type(&spec)?;
        nodes.shape?;
        self.check_account(&spec, &caller.owner.user)?;
        let both = super::sched::Checked {
            qos: true,
            nice: true,
        };
        self.check_qos_and_nice(&spec, caller, &caller.owner.user, both)?;
        let tasks = match &req.job.array {
            Some(a) => {
                let bytes = serde_json::to_vec(&spec).map_or(0, |v| v.len());
                self.check_array(a, bytes)?
            }
            None => 1,
        };
        self.check_limits(
            &spec,
            &caller.owner,
            &earlier.limited,
            tasks,
            &Default::default(),
        )?;
        self.check_dependency(req.job.dependency.as_ref(), caller)?;
        let uid = caller.owner.uid;
        let pending = self.jobs.pending_of(uid) as usize + earlier.pending_of(uid);
        if pending + tasks > self.max_pending_per_user as usize {
            return Err(Failure::new(
                ErrorKind::Unavailable,
                format!(
                    "you have {pending} pending jobs and this submit adds {tasks}; one user may \
                     have {} ([limits] max_pending_per_user); wait for some to start or cancel some",
                    self.max_pending_per_user
                ),
            ));
        }
        // A path (a SIF file on shared storage) is checked by the node that runs the job. A
        // name no node has imported is a registry reference, pulled by the node that runs the
        // job: it must parse now, so that a bad one is never queued.
        if spec.image != "host"
            && !spec.image.starts_with('/')
            && !self.nodes.is_empty()
            && !self.nodes.values().any(|n| n.images.contains(&spec.image))
        {
            if let Err(why) = spec.image.parse::<wharf_api::image_ref::ImageRef>() {
                return Err(Failure::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "unknown image {:?}: no node has imported it, and it is not a registry \
                         reference ({why}); import it with `wharf image import SOURCE --name {}`, \
                         name a registry image, or use image \"host\"",
                        spec.image, spec.image
                    ),
                ));
            }
        }
        if let Some(cred) = &req.registry_auth {
            check_credential(cred, &spec.image)?;
        }
        let mut record = JobRecord::pending(
            caller.owner.clone(),
            spec.name.clone(),
            spec.resources,
            spec.time_limit,
            now,
        );
        record.reason = Some("Queued: waiting for the scheduler".into());
        record.begin_time = (req.job.begin)
            .map(|b| b.checked_at(now))
            .transpose()
            .map_err(|e| Failure::new(ErrorKind::InvalidInput, e))?;
        record.hold = (req.job.hold == Some(true)).then_some(wharf_api::Hold::User);
        record.dependency = req.job.dependency.clone();
        record.spec = Some(spec);
        Ok(match &req.job.array {
            Some(array) => super::array::task_records(record, array),
            None => vec![record],
        })
    }
}

impl Cluster {
    /// Stores the submit's registry credential for each of its new jobs (one, or every task
    /// of an array). A job whose credential cannot be written runs without it: its pull then
    /// fails with the registry's refusal, which says what is missing.
    fn keep_credential(&self, records: &[JobRecord], cred: &RegistryCredential) {
        for r in records {
            if let Err(e) = self.credentials.put(r.id, cred) {
                tracing::error!(job = r.id, error = %e, "cannot store the job's registry credential");
            }
        }
    }
}

/// A submit's registry credential must be well formed and for the registry its image names.
fn check_credential(cred: &RegistryCredential, image: &str) -> Result<(), Failure> {
    cred.validate()
        .map_err(|m| Failure::new(ErrorKind::InvalidInput, m))?;
    let named = Some(image)
        .filter(|i| *i != "host" && !i.starts_with('/'))
        .and_then(|i| i.parse::<wharf_api::image_ref::ImageRef>().ok())
        .ok_or_else(|| {
            Failure::new(
                ErrorKind::InvalidInput,
                format!(
                    "registry_auth is given, but the job's image {image:?} is not a registry \
                     reference"
                ),
            )
        })?;
    if named.registry != cred.registry {
        return Err(Failure::new(
            ErrorKind::InvalidInput,
            format!(
                "registry_auth is for registry {:?}, but the job's image is from {:?}; a \
                 credential is sent only for the registry the job names",
                cred.registry, named.registry
            ),
        ));
    }
    Ok(())
}

impl Added<'_> {
    fn pending_of(&self, uid: u32) -> usize {
        self.pending.get(&uid).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;
