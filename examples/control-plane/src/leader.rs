//! Leader election on a `coordination.k8s.io/v1` Lease, as Kubernetes controllers (and
//! istiod) elect the one replica that writes.
//!
//! Every replica runs the election; the holder renews the Lease every
//! [`LeaseConfig::retry_period`], the others read it as often. A Lease whose record (holder
//! and renew time) has not changed for [`LeaseConfig::lease_duration`] of the reader's own
//! clock is taken over, so replicas never compare clocks with each other. Every write replaces
//! the Lease at the `resourceVersion` read, so of two replicas racing for it one wins and the
//! other gets a conflict. A holder that cannot renew for [`LeaseConfig::renew_deadline`]
//! stops leading before anyone else may take over (the deadline is shorter than the
//! duration), and a holder that stops releases the Lease, so the next one takes it at once.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::sync::watch;

/// Which Lease the replicas elect their leader on, who this replica is, and the timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name. Default `meshkit-control-plane`.
    pub name: String,
    /// This replica's name in the Lease's `holderIdentity` (the Pod name, say); unique among
    /// the replicas.
    pub identity: String,
    /// How long a Lease whose record does not change stays held. Default 15 s.
    pub lease_duration: Duration,
    /// How long the holder keeps leading while it cannot renew. Default 10 s; shorter than
    /// the duration.
    pub renew_deadline: Duration,
    /// How often the Lease is renewed, or read by the others. Default 2 s.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// The Lease `meshkit-control-plane` in `namespace`, held as `identity`, with the timing
    /// of Kubernetes' own controllers (15 s, 10 s, 2 s).
    pub fn new(namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: "meshkit-control-plane".to_owned(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Sets the Lease's name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the timing: the duration, and the renew deadline and retry period within it
    /// (the deadline is cut to fit between the period and the duration).
    pub fn with_timing(
        mut self,
        duration: Duration,
        renew_deadline: Duration,
        retry: Duration,
    ) -> Self {
        self.lease_duration = duration.max(Duration::from_secs(1));
        self.retry_period = retry.clamp(Duration::from_millis(100), self.lease_duration / 2);
        // At least one period short of the duration: a holder that cannot renew stops
        // before another replica may take over.
        self.renew_deadline =
            renew_deadline.clamp(self.retry_period, self.lease_duration - self.retry_period);
        self
    }
}

/// The Lease's record as last read, and when (by this replica's clock) it last changed.
struct Observed {
    holder: String,
    renew_time: Option<MicroTime>,
    duration: Duration,
    since: Instant,
}

/// Runs the election until `stop`, telling `leader` whether this replica leads; on stop a
/// leader releases the Lease.
pub(crate) async fn run(
    client: kube::Client,
    config: LeaseConfig,
    leader: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut observed: Option<Observed> = None;
    let mut renewed: Option<Instant> = None;
    loop {
        // A round that hangs must not keep this replica leading: it is cut short by the
        // deadline of the last renewal (or one period, when not leading).
        let bound = match renewed.filter(|_| *leader.borrow()) {
            Some(at) => (at + config.renew_deadline).saturating_duration_since(Instant::now()),
            None => config.retry_period,
        };
        let round = tokio::time::timeout(bound, try_acquire_or_renew(&api, &config, &mut observed));
        let result = match round.await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service(
                "the Lease round took longer than the renew deadline".into(),
            )),
        };
        match result {
            Ok(true) => {
                renewed = Some(Instant::now());
                if !leader.send_replace(true) {
                    tracing::info!(lease = %config.name, identity = %config.identity, "leading: this replica writes status");
                }
            }
            Ok(false) => step_down(&leader, &config, "another replica holds the lease"),
            Err(error) => {
                tracing::warn!(lease = %config.name, %error, "the lease could not be read or renewed");
                if renewed.is_none_or(|at| at.elapsed() >= config.renew_deadline) {
                    step_down(&leader, &config, "the lease could not be renewed in time");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(config.retry_period) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    if leader.send_replace(false) {
        release(&api, &config).await;
    }
}

fn step_down(leader: &watch::Sender<bool>, config: &LeaseConfig, why: &str) {
    if leader.send_replace(false) {
        tracing::warn!(lease = %config.name, identity = %config.identity, why, "no longer leading");
    }
}

/// One round: `Ok(true)` when this replica holds the Lease after it.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    config: &LeaseConfig,
    observed: &mut Option<Observed>,
) -> Result<bool, kube::Error> {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let duration_seconds = i32::try_from(config.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(duration_seconds),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(config.lease_duration, Duration::from_secs);
    let same = observed
        .as_ref()
        .is_some_and(|o| o.holder == holder && o.renew_time == spec.renew_time);
    if !same {
        *observed = Some(Observed {
            holder: holder.clone(),
            renew_time: spec.renew_time.clone(),
            duration,
            since: Instant::now(),
        });
    }
    let held_by_other = !holder.is_empty()
        && holder != config.identity
        && observed
            .as_ref()
            .is_some_and(|o| o.since.elapsed() < o.duration);
    if held_by_other {
        return Ok(false);
    }
    let taking_over = holder != config.identity;
    let transitions = spec.lease_transitions.unwrap_or(0);
    lease.spec = Some(LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: Some(duration_seconds),
        acquire_time: if taking_over {
            Some(now.clone())
        } else {
            spec.acquire_time
        },
        renew_time: Some(now.clone()),
        lease_transitions: Some(if taking_over {
            transitions.saturating_add(1)
        } else {
            transitions
        }),
        ..spec
    });
    // The resourceVersion read makes this a compare-and-swap.
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => {
            *observed = Some(Observed {
                holder: config.identity.clone(),
                renew_time: Some(now),
                duration: config.lease_duration,
                since: Instant::now(),
            });
            if taking_over {
                tracing::info!(lease = %config.name, previous = %holder, "took over the lease");
            }
            Ok(true)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up (holder empty, duration 1 s), so the next replica takes it at once.
async fn release(api: &Api<Lease>, config: &LeaseConfig) {
    let Ok(Some(mut lease)) = api.get_opt(&config.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => tracing::info!(lease = %config.name, "released the lease"),
        Err(error) => {
            tracing::warn!(lease = %config.name, %error, "the lease could not be released")
        }
    }
}
