//! The metasrv leader's datanode registry: registrations (a new incarnation per datanode start, persisted by
//! compare-and-put), heartbeats, and the region leases granted in their answers (`docs/datanode.md`).
//!
//! **Who gets a lease.** A region's leader lease goes only to the datanode its table route names, at the route's
//! region epoch, and only while the datanode reports the region open. A Kafka region gets one only once its
//! `__topic_region` key holds a checkpoint (so everything it writes is above a checkpoint a prune sees).
//!
//! **Why a lease never overlaps another holder's.** Leases are counted by the datanode from when it sent the
//! heartbeat, by the metasrv from when it answered (later), plus [`LEASE_MARGIN`] for clock-rate drift. Within one
//! incarnation the holder only extends its own lease. Between incarnations of one datanode: a new incarnation gets
//! no lease until every lease of the one it replaced has run out — after the last grant this leader made to it, or,
//! when this leader never saw it, one whole lease of the predecessor's after this leader's term began (a previous
//! leader may have granted up to its last moment). The registration record says `cleared` once its incarnation
//! waited that out, so a later leader can grant to it at once. Routes change only through procedures, whose
//! writes are fenced by the leader's epoch.
//!
//! The registry lives in memory on the leader; after a failover the new leader rebuilds it from heartbeats.
//!
//! **What a heartbeat reads.** A datanode's regions, their epochs and their topic-region key names (its *plan*)
//! are kept for the term and read again only once the metasrv's [`WriteGeneration`] of the `__dn_table` and route
//! keys has moved, or after [`ASSIGNMENT_TRUSTED_FOR`]: an unchanged datanode is answered from memory, reading
//! only its Kafka regions' `__topic_region` keys.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::FailoverConfig;
use crate::datanode::protocol::{
    HeartbeatRequest, HeartbeatResponse, Instruction, RegionLease, RegionRole, RegionStat,
    RegionToOpen, RegisterRequest, RegisterResponse, WalLost, lease_for,
};
use crate::datanode::{RegionOpenRequest, RegionOpener, WalProviderKind};
use crate::ddl::drop_table::tombstone_key;
use crate::ddl::error::DecodeMetadataSnafu;
use crate::ddl::region::{region_number, region_table_id as table_id_of};
use crate::error::{
    DatanodeNotRegisteredSnafu, DatanodeRegistrationContentionSnafu, DatanodeRetiredSnafu,
    DatanodeStaleIncarnationSnafu, DatanodeStillHeartbeatingSnafu, DatanodeUnknownSnafu, Result,
};
use crate::key::region_drop::{
    DroppedWal, REGION_DROP_PREFIX, RegionDropValue, parse_region_drop_key, region_drop_key,
};
use crate::key::table_route::TableRouteValue;
use crate::key::table_route::table_route_key;
use crate::key::topic_name::{TopicId, TopicNameValue, get_topic_value};
use crate::key::topic_region::{TopicRegionValue, topic_region_key};
use crate::kv::{CompareAndPutRequest, KvBackendRef, RangeRequest, WriteGeneration};
use crate::metasrv::failure_detector::PhiAccrualDetector;
use crate::wal::{WAL_OPTIONS_KEY, WalOptions};

/// Prefix of the datanode registration keys: `__datanode/{id}`.
pub const DATANODE_KEY_PREFIX: &str = "__datanode";

/// What the metasrv adds to a lease when it reckons when the lease ends: for clock-rate drift between it and the
/// datanode, and the time a heartbeat's answer takes to arrive.
pub const LEASE_MARGIN: Duration = Duration::from_millis(500);

/// A registration is refused while the current incarnation heartbeated within this many of its intervals.
const LIVE_HEARTBEATS: u32 = 2;

/// `__datanode/{id}`.
pub fn datanode_key(datanode_id: u64) -> String {
    format!("{DATANODE_KEY_PREFIX}/{datanode_id}")
}

/// The value of `__datanode/{id}`: the datanode's current incarnation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeRecord {
    /// The current incarnation (from 1).
    pub incarnation: u64,
    /// Where it said it listens.
    pub address: String,
    /// The lease its heartbeats get, in milliseconds.
    pub lease_ms: u64,
    /// The lease of the incarnation it replaced, in milliseconds (0 for the first).
    #[serde(default)]
    pub previous_lease_ms: u64,
    /// Whether every lease of the incarnations before it had run out before it got its first.
    #[serde(default)]
    pub cleared: bool,
    /// Set when the incarnation failed and its regions were failed over: its heartbeats are refused as stale (it
    /// must register again), and it is not failed over again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retired: bool,
}

/// A leader lease the registry granted on one region.
#[derive(Clone, Copy, Debug)]
struct RegionGrant {
    /// When it ends: the answer's time + the lease.
    until: Instant,
    /// The incarnation it went to.
    incarnation: u64,
    /// The count of the heartbeat whose answer carried it ([`HeartbeatRequest::seq`]; 0: not counted). A later
    /// heartbeat of the same incarnation that no longer reports the region was built after the region closed
    /// there, and a closed region acknowledges nothing more (`Datanode::close_region`): the lease is void.
    seq: u64,
}

/// How often a datanode is asked to heartbeat while a region handed to it waits for a live datanode to close it:
/// the old holder is told to close it at its next heartbeat and reports the close at once.
pub const HANDOVER_POLL: Duration = Duration::from_millis(100);

/// How long after a datanode is retired the others are asked to heartbeat every [`HANDOVER_POLL`] (its failover's
/// migrations move the routes within this).
pub const FAILOVER_POLL_WINDOW: Duration = Duration::from_secs(2);

/// What the registry knows of one datanode.
#[derive(Clone, Debug)]
struct Node {
    record: DatanodeRecord,
    interval: Duration,
    last_heartbeat: Option<Instant>,
    /// When the latest lease this term granted it ends, reckoned from the answer's time.
    leases_until: Option<Instant>,
    /// Per region: the latest leader lease this term granted it on that region. Kept across its
    /// re-registrations: a region that moves away from it is given to another datanode only once these have run
    /// out, or once the incarnation they went to reported the region closed ([`RegionGrant::seq`]).
    region_leases: HashMap<u64, RegionGrant>,
    /// No lease before this.
    leases_from: Instant,
    regions: Vec<RegionStat>,
    /// The count of the heartbeat `regions` came from ([`HeartbeatRequest::seq`]): an older heartbeat arriving
    /// late does not replace them.
    regions_seq: u64,
    /// The regions it refused to open because their WAL tail was lost, as it last reported them.
    wal_lost: Vec<WalLost>,
    leases: usize,
    /// Fed by its heartbeats' arrival times this term.
    detector: PhiAccrualDetector,
}

#[derive(Debug)]
struct Inner {
    /// When this server's current term began (`None`: not leading).
    term_start: Option<Instant>,
    nodes: BTreeMap<u64, Node>,
    /// When every leader lease an earlier term may have granted has run out: the term's start plus the longest
    /// lease any registered datanode holds, plus [`LEASE_MARGIN`]. Read once per term, when a moved region first
    /// needs it.
    earlier_terms_until: Option<Instant>,
    /// Until when every datanode is asked to heartbeat every [`HANDOVER_POLL`]: a datanode was just retired, so
    /// its regions are about to move, and their targets learn of them at their next heartbeat.
    failing_over_until: Option<Instant>,
    /// Per region closed this term by the datanode that held it: the highest last entry id such a datanode
    /// reported having acknowledged ([`RegionToOpen::expected_last_entry_id`]).
    closed_at: HashMap<u64, u64>,
}

/// One datanode as `GET /v1/datanodes` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatanodeInfo {
    /// Its id.
    pub id: u64,
    /// Its address.
    pub address: String,
    /// Its current incarnation.
    pub incarnation: u64,
    /// Milliseconds since its last heartbeat (`None` before the first this term).
    pub last_heartbeat_ms: Option<u64>,
    /// Its regions, as it last reported them.
    pub regions: Vec<RegionStat>,
    /// Leases granted in the last answer.
    pub leases: usize,
    /// Milliseconds until it may get leases (`None`: it may).
    pub leases_in_ms: Option<u64>,
    /// The failure detector's suspicion now, to two decimals (`docs/datanode.md`, "Failure detection").
    #[serde(default)]
    pub phi: f64,
    /// Whether the leader suspects it has failed: `phi` at or above `[failover] phi_threshold`, after the term's
    /// warm-up.
    #[serde(default)]
    pub suspected: bool,
    /// The regions it refused to open because their WAL tail was lost with their topic ([`WalLost`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wal_lost: Vec<WalLost>,
}

/// How long a cached assignment or route is trusted without reading the store again, even when no write to the
/// watched keys ended through this metasrv meanwhile: a backstop for a write the generation cannot see (one that
/// a store applied after its call had ended with an error).
pub const ASSIGNMENT_TRUSTED_FOR: Duration = Duration::from_secs(10);

/// The datanodes registered with this leader.
#[derive(Debug)]
pub struct DatanodeRegistry {
    kv: KvBackendRef,
    ids: Vec<u64>,
    expected: WalProviderKind,
    inner: Mutex<Inner>,
    /// The generation of the `__dn_table`, route and `__region_drop` keys written through this metasrv (`None`: nothing cached is
    /// trusted; every heartbeat reads the store).
    generation: Option<WriteGeneration>,
    /// When a datanode is suspected.
    failover: FailoverConfig,
    /// What was read and decoded, with the bytes and the generation it was read at.
    decoded: Mutex<Decoded>,
}

/// One thing the registry read and decoded.
#[derive(Debug)]
struct Cached<B, T> {
    /// The write generation taken before the read (`None`: read without one).
    generation: Option<u64>,
    /// When it was read.
    read_at: Instant,
    /// The bytes read: an unchanged read is not decoded again.
    bytes: B,
    /// What they decode to.
    value: T,
}

impl<B, T> Cached<B, T> {
    /// Whether it can be used without reading again: no watched write ended since it was read at `generation`,
    /// within [`ASSIGNMENT_TRUSTED_FOR`].
    fn trusted(&self, generation: Option<u64>, now: Instant) -> bool {
        generation.is_some()
            && self.generation == generation
            && now.saturating_duration_since(self.read_at) < ASSIGNMENT_TRUSTED_FOR
    }
}

/// What the registry decoded last, with the bytes it decoded it from.
#[derive(Debug, Default)]
struct Decoded {
    /// Per datanode: its `__dn_table` records as read, and their open requests.
    assignments: HashMap<u64, Cached<Vec<crate::kv::KeyValue>, Arc<Vec<RegionOpenRequest>>>>,
    /// Per table: its route's bytes, and its regions' epochs.
    epochs: HashMap<u32, Cached<Vec<u8>, RouteEpochs>>,
    /// Per datanode: what its heartbeats are answered from.
    plans: HashMap<u64, Cached<(), Arc<Plan>>>,
    /// The dropped regions whose storage is still to be deleted (`__region_drop` keys).
    drops: Option<Cached<(), PendingDrops>>,
}

/// Region id → what its `__region_drop` key says.
type PendingDrops = Arc<BTreeMap<u64, RegionDropValue>>;

/// At most this many `__region_drop` keys are read at once (the rest are handed out as these are deleted).
pub const PENDING_DROPS_READ: usize = 1024;

/// At most this many `Drop` instructions go out in one heartbeat answer.
pub const DROPS_PER_HEARTBEAT: usize = 64;

/// Region number → region epoch of one table's route.
type RouteEpochs = Arc<BTreeMap<u32, u64>>;

impl DatanodeRegistry {
    /// A registry on `kv` for datanodes `ids`, whose regions use the WAL `expected`.
    pub fn new(kv: KvBackendRef, ids: Vec<u64>, expected: WalProviderKind) -> Self {
        DatanodeRegistry {
            kv,
            ids,
            expected,
            inner: Mutex::new(Inner {
                term_start: None,
                nodes: BTreeMap::new(),
                earlier_terms_until: None,
                failing_over_until: None,
                closed_at: HashMap::new(),
            }),
            generation: None,
            failover: FailoverConfig::default(),
            decoded: Mutex::new(Decoded::default()),
        }
    }

    /// Suspects datanodes by `failover`'s detector settings (default: [`FailoverConfig::default`]).
    pub fn with_failover(mut self, failover: FailoverConfig) -> Self {
        self.failover = failover;
        self
    }

    /// Trusts what it read of the `__dn_table` and route keys until `generation` moves (or for
    /// [`ASSIGNMENT_TRUSTED_FOR`]), instead of reading them at every heartbeat. `generation` must move after every
    /// write of those keys made while this registry's term lasts: the metasrv's
    /// [`WatchedKvBackend`](crate::kv::WatchedKvBackend), through which every write of a leader goes, and a
    /// leader is the only writer of routes during its term (its writes are fenced by it).
    pub fn with_write_generation(mut self, generation: WriteGeneration) -> Self {
        self.generation = Some(generation);
        self
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A term begins (this server now leads): what an earlier term knew is forgotten.
    pub fn begin_term(&self) {
        let mut inner = self.inner();
        inner.term_start = Some(Instant::now());
        inner.nodes.clear();
        inner.earlier_terms_until = None;
        inner.failing_over_until = None;
        inner.closed_at.clear();
        *self.decoded() = Decoded::default();
    }

    /// The term ended.
    pub fn end_term(&self) {
        let mut inner = self.inner();
        inner.term_start = None;
        inner.nodes.clear();
        inner.earlier_terms_until = None;
        inner.failing_over_until = None;
        inner.closed_at.clear();
        *self.decoded() = Decoded::default();
    }

    fn check_id(&self, datanode_id: u64) -> Result<()> {
        snafu::ensure!(
            self.ids.contains(&datanode_id),
            DatanodeUnknownSnafu {
                datanode_id,
                ids: self.ids.clone(),
            }
        );
        Ok(())
    }

    async fn read_record(&self, datanode_id: u64) -> Result<Option<(Vec<u8>, DatanodeRecord)>> {
        let key = datanode_key(datanode_id);
        match self.kv.get(key.as_bytes()).await? {
            None => Ok(None),
            Some(kv) => {
                let record = serde_json::from_slice(&kv.value).context_decode(&key)?;
                Ok(Some((kv.value, record)))
            }
        }
    }

    /// Registers a starting datanode: a new incarnation, persisted by compare-and-put. Refused for an id outside
    /// `[datanodes] ids`, and while the current incarnation still heartbeats.
    pub async fn register(&self, request: &RegisterRequest) -> Result<RegisterResponse> {
        let datanode_id = request.datanode_id;
        self.check_id(datanode_id)?;
        let interval = Duration::from_millis(request.heartbeat_interval_ms.max(1));
        let lease = lease_for(interval);
        {
            let inner = self.inner();
            if let Some(node) = inner.nodes.get(&datanode_id)
                && let Some(last) = node.last_heartbeat
                && last.elapsed() < node.interval.saturating_mul(LIVE_HEARTBEATS)
            {
                return DatanodeStillHeartbeatingSnafu {
                    datanode_id,
                    incarnation: node.record.incarnation,
                    address: node.record.address.clone(),
                    age_ms: u64::try_from(last.elapsed().as_millis()).unwrap_or(u64::MAX),
                }
                .fail();
            }
        }
        let key = datanode_key(datanode_id);
        let stored = self.read_record(datanode_id).await?;
        let previous = stored.as_ref().map(|(_, r)| r.clone());
        let record = DatanodeRecord {
            incarnation: previous.as_ref().map_or(1, |p| p.incarnation + 1),
            address: request.address.clone(),
            lease_ms: millis(lease),
            // The longest lease any earlier incarnation may still hold: its own, and, while it never waited out its
            // predecessors (not cleared), theirs too.
            retired: false,
            previous_lease_ms: previous.as_ref().map_or(0, |p| {
                if p.cleared {
                    p.lease_ms
                } else {
                    p.lease_ms.max(p.previous_lease_ms)
                }
            }),
            cleared: previous.is_none(),
        };
        let value = serde_json::to_vec(&record).unwrap_or_default();
        let response = self
            .kv
            .compare_and_put(CompareAndPutRequest {
                key: key.clone().into_bytes(),
                expect: stored.map(|(bytes, _)| bytes),
                value,
            })
            .await?;
        snafu::ensure!(
            response.success,
            DatanodeRegistrationContentionSnafu { datanode_id, key }
        );
        let now = Instant::now();
        let mut inner = self.inner();
        let term_start = inner.term_start.unwrap_or(now);
        // No lease before every lease an earlier incarnation may hold ran out: those an earlier leader granted end
        // by this term's start + their length; those this term granted, by their recorded end.
        let leases_from = match &previous {
            None => now,
            Some(_) => {
                let earlier_terms =
                    term_start + Duration::from_millis(record.previous_lease_ms) + LEASE_MARGIN;
                let this_term = inner.nodes.get(&datanode_id).map(|node| {
                    node.leases_until
                        .map_or(node.leases_from, |until| until + LEASE_MARGIN)
                        .max(node.leases_from)
                });
                this_term.map_or(earlier_terms, |t| t.max(earlier_terms))
            }
        };
        let region_leases = inner
            .nodes
            .get(&datanode_id)
            .map(|node| node.region_leases.clone())
            .unwrap_or_default();
        inner.nodes.insert(
            datanode_id,
            Node {
                record: record.clone(),
                interval,
                last_heartbeat: None,
                leases_until: None,
                region_leases,
                leases_from: leases_from.max(now),
                regions: Vec::new(),
                regions_seq: 0,
                wal_lost: Vec::new(),
                leases: 0,
                detector: PhiAccrualDetector::new(&self.failover, interval),
            },
        );
        Ok(RegisterResponse {
            datanode_id,
            incarnation: record.incarnation,
        })
    }

    /// A heartbeat: records the datanode's regions, moves its regions' checkpoints forward, and answers with the
    /// leases it may hold and what it must open, close or flush. A stale incarnation is refused (it must stop).
    pub async fn heartbeat(
        &self,
        request: &HeartbeatRequest,
        flush: &BTreeSet<u64>,
    ) -> Result<HeartbeatResponse> {
        let datanode_id = request.datanode_id;
        self.check_id(datanode_id)?;
        let known = self
            .inner()
            .nodes
            .get(&datanode_id)
            .map(|n| n.record.incarnation);
        if known != Some(request.incarnation) {
            self.load_node(request).await?;
        }
        let now = Instant::now();
        let (leases_from, cleared, lease_ms) = {
            let mut inner = self.inner();
            let Some(node) = inner.nodes.get_mut(&datanode_id) else {
                return DatanodeNotRegisteredSnafu {
                    datanode_id,
                    incarnation: request.incarnation,
                }
                .fail();
            };
            snafu::ensure!(
                !node.record.retired,
                DatanodeRetiredSnafu {
                    datanode_id,
                    incarnation: request.incarnation,
                }
            );
            node.last_heartbeat = Some(now);
            if request.early {
                node.detector.early_heartbeat(now);
            } else {
                node.detector.heartbeat(now);
            }
            node.interval = Duration::from_millis(request.heartbeat_interval_ms.max(1));
            if request.seq == 0 || request.seq >= node.regions_seq {
                node.regions = request.regions.clone();
                node.regions_seq = request.seq;
            }
            if request.seq > 0 {
                let open: HashSet<u64> = request.regions.iter().map(|r| r.region_id).collect();
                node.region_leases.retain(|region_id, grant| {
                    open.contains(region_id)
                        || grant.incarnation != request.incarnation
                        || grant.seq >= request.seq
                });
            }
            if node.wal_lost != request.wal_lost {
                for lost in &request.wal_lost {
                    if !node.wal_lost.contains(lost) {
                        tracing::warn!(datanode = datanode_id, "{lost}");
                    }
                }
                node.wal_lost = request.wal_lost.clone();
            }
            node.record.address = request.address.clone();
            let answer = (node.leases_from, node.record.cleared, node.record.lease_ms);
            // What the regions it closed had acknowledged: their next leaders must replay that far.
            for closed in &request.closed {
                let at = inner.closed_at.entry(closed.region_id).or_insert(0);
                *at = (*at).max(closed.last_entry_id);
            }
            answer
        };

        // What the route gives this datanode, and which of it the datanode reports.
        let plan = self.plan(datanode_id).await?;
        let mut reported: Vec<Option<&RegionStat>> = vec![None; plan.regions.len()];
        let mut unassigned: Vec<u64> = Vec::new();
        for stat in &request.regions {
            match plan.index.get(&stat.region_id) {
                Some(i) => reported[*i] = Some(stat),
                None => unassigned.push(stat.region_id),
            }
        }
        // The topic-region keys of the reported Kafka regions, read in one request: a region whose key is gone
        // (dropped) gets no lease, whatever was known of it before.
        let keys: Vec<Vec<u8>> = plan
            .regions
            .iter()
            .zip(&reported)
            .filter(|(_, stat)| stat.is_some())
            .filter_map(|(region, _)| region.topic_region_key.clone())
            .collect();
        let mut stored: HashMap<Vec<u8>, crate::kv::KeyValue> = HashMap::new();
        if !keys.is_empty() {
            for kv in self.kv.batch_get(&keys).await? {
                stored.insert(kv.key.clone(), kv);
            }
        }

        let mut response = HeartbeatResponse::default();
        let may_lease = now >= leases_from;
        if !may_lease {
            let wait = millis(leases_from - now).max(1);
            response.leases_in_ms = Some(wait);
            response.heartbeat_in_ms = Some(wait);
        } else if !cleared {
            self.clear(request).await?;
        }
        let mut pruned: HashMap<String, Option<TopicNameValue>> = HashMap::new();
        let earlier_terms = self.earlier_terms_until(&plan, &reported, now).await?;
        for ((req, region), stat) in plan.requests.iter().zip(&plan.regions).zip(&reported) {
            let epoch = region.epoch;
            // A region that moved here is neither opened nor leased while another datanode may still lead it:
            // opened after its last lease elsewhere ran out, the replay holds everything that lease acknowledged.
            let handed_over = self.held_elsewhere_until(
                datanode_id,
                req.region_id,
                epoch,
                stat.map(|s| s.epoch),
                earlier_terms,
                now,
            );
            if let Some((until, holder_alive)) = handed_over {
                let wait = millis(until - now).max(1);
                response.leases_in_ms = Some(response.leases_in_ms.map_or(wait, |w| w.max(wait)));
                // A live holder closes it at its next heartbeat: ask again soon. Otherwise when its lease ends.
                let again = if holder_alive {
                    wait.min(millis(HANDOVER_POLL))
                } else {
                    wait
                };
                response.heartbeat_in_ms =
                    Some(response.heartbeat_in_ms.map_or(again, |h| h.min(again)));
                continue;
            }
            let Some(stat) = stat else {
                // Opened only once every earlier incarnation's leases ran out: its replay then starts after all
                // they could acknowledge.
                if may_lease {
                    let to_open = self.region_to_open(req, epoch, &mut pruned).await?;
                    response.instructions.push(Instruction::Open(to_open));
                }
                continue;
            };
            let leasable = match &region.topic_region_key {
                None => true,
                Some(key) => match stored.get(key) {
                    None => false,
                    Some(found) => {
                        let value = TopicRegionValue::decode(&found.key, &found.value)?;
                        // An id the datanode read at open is recorded once, even with no entry to move past.
                        let id_known = value.topic_id.is_some() || stat.topic_id.is_none();
                        match value.checkpoint {
                            Some(c) if c.entry_id >= stat.flushed_entry_id && id_known => true,
                            _ => self
                                .advance_checkpoint(found, stat.flushed_entry_id, stat.topic_id)
                                .await?
                                .is_some(),
                        }
                    }
                },
            };
            if flush.contains(&req.region_id) {
                response.instructions.push(Instruction::Flush {
                    region_id: req.region_id,
                });
            }
            if may_lease && leasable {
                response.leases.push(RegionLease {
                    region_id: req.region_id,
                    role: RegionRole::Leader,
                    epoch,
                    duration_ms: lease_ms,
                });
            }
        }
        let drops = self.pending_drops().await?;
        let dropped = self.forget_dropped(request, &drops).await?;
        let unassigned: Vec<u64> = unassigned
            .into_iter()
            .filter(|id| !drops.contains_key(id))
            .collect();
        let dropped_tables = self.tables_being_dropped(&unassigned).await?;
        for region_id in unassigned {
            response.instructions.push(Instruction::Close {
                region_id,
                dropped: dropped_tables.contains(&table_id_of(region_id)),
            });
        }
        // A dropped region's storage is deleted once no datanode leads it (DropTable wrote its key after that).
        response.instructions.extend(
            drops
                .iter()
                .filter(|(id, drop)| drop.for_datanode(datanode_id) && !dropped.contains(id))
                .take(DROPS_PER_HEARTBEAT)
                .map(|(id, drop)| Instruction::Drop {
                    region_id: *id,
                    raft_engine: drop.wal == DroppedWal::RaftEngine,
                }),
        );
        let mut inner = self.inner();
        // A datanode was just retired: its regions' new datanodes learn of them at their next heartbeat.
        if inner
            .failing_over_until
            .is_some_and(|until| until > Instant::now())
        {
            let poll = millis(HANDOVER_POLL);
            response.heartbeat_in_ms = Some(response.heartbeat_in_ms.map_or(poll, |h| h.min(poll)));
        }
        let Some(node) = inner.nodes.get_mut(&datanode_id) else {
            return DatanodeNotRegisteredSnafu {
                datanode_id,
                incarnation: request.incarnation,
            }
            .fail();
        };
        // A registration that replaced this incarnation meanwhile reckoned without these leases: none goes out.
        if node.record.incarnation != request.incarnation {
            return DatanodeStaleIncarnationSnafu {
                datanode_id,
                incarnation: request.incarnation,
                current: node.record.incarnation,
            }
            .fail();
        }
        node.leases = response.leases.len();
        let answered = Instant::now();
        node.region_leases
            .retain(|_, grant| grant.until + LEASE_MARGIN > answered);
        for lease in &response.leases {
            node.region_leases.insert(
                lease.region_id,
                RegionGrant {
                    until: answered + Duration::from_millis(lease_ms),
                    incarnation: request.incarnation,
                    seq: request.seq,
                },
            );
        }
        if !response.leases.is_empty() {
            let until = answered + Duration::from_millis(lease_ms);
            node.leases_until = Some(node.leases_until.map_or(until, |u| u.max(until)));
            node.record.cleared = true;
        }
        Ok(response)
    }

    /// Until when a region the route gives `datanode_id` at `epoch` may still be led elsewhere (`None`: it may be
    /// opened and leased here now), and whether a datanode holding one of those leases still heartbeats (it will
    /// be told to close the region and say so). A region at epoch 0 never moved: only this datanode ever held it.
    /// One the datanode reports at `epoch` already got a lease at that epoch, which went out only after the wait.
    /// Otherwise every leader lease another datanode got on it must have run out or been given up: those this
    /// term granted by their recorded end unless the incarnation they went to reported the region closed since,
    /// those an earlier term may have granted by `earlier_terms`.
    fn held_elsewhere_until(
        &self,
        datanode_id: u64,
        region_id: u64,
        epoch: u64,
        reported_epoch: Option<u64>,
        earlier_terms: Option<Instant>,
        now: Instant,
    ) -> Option<(Instant, bool)> {
        if epoch == 0 || reported_epoch == Some(epoch) {
            return None;
        }
        let inner = self.inner();
        let mut holder_alive = false;
        let mut this_term: Option<Instant> = None;
        for (_, node) in inner.nodes.iter().filter(|(id, _)| **id != datanode_id) {
            let Some(grant) = node.region_leases.get(&region_id) else {
                continue;
            };
            let until = grant.until + LEASE_MARGIN;
            if until <= now {
                continue;
            }
            this_term = Some(this_term.map_or(until, |t| t.max(until)));
            holder_alive |= grant.incarnation == node.record.incarnation
                && node.last_heartbeat.is_some_and(|last| {
                    now.saturating_duration_since(last)
                        < node.interval.saturating_mul(LIVE_HEARTBEATS)
                });
        }
        let until = this_term.into_iter().chain(earlier_terms).max()?;
        (until > now).then_some((
            until,
            holder_alive && earlier_terms.is_none_or(|e| e <= now),
        ))
    }

    /// When every lease an earlier term may have granted has run out (see [`Inner::earlier_terms_until`]), read
    /// only when one of `plan`'s regions moved (epoch above 0) and is not reported at its epoch yet.
    async fn earlier_terms_until(
        &self,
        plan: &Plan,
        reported: &[Option<&RegionStat>],
        now: Instant,
    ) -> Result<Option<Instant>> {
        let moved =
            plan.regions.iter().zip(reported).any(|(region, stat)| {
                region.epoch > 0 && stat.map(|s| s.epoch) != Some(region.epoch)
            });
        if !moved {
            return Ok(None);
        }
        let (term_start, known) = {
            let inner = self.inner();
            (inner.term_start.unwrap_or(now), inner.earlier_terms_until)
        };
        if let Some(until) = known {
            return Ok(Some(until));
        }
        let keys: Vec<Vec<u8>> = self
            .ids
            .iter()
            .map(|id| datanode_key(*id).into_bytes())
            .collect();
        let mut longest = 0;
        for kv in self.kv.batch_get(&keys).await? {
            let key = String::from_utf8_lossy(&kv.key).into_owned();
            let record: DatanodeRecord = serde_json::from_slice(&kv.value).context_decode(&key)?;
            longest = longest.max(record.lease_ms).max(record.previous_lease_ms);
        }
        let until = term_start + Duration::from_millis(longest) + LEASE_MARGIN;
        self.inner().earlier_terms_until = Some(until);
        Ok(Some(until))
    }

    /// The datanode leading region `region_id` now, and at which region epoch: one that reported it as leader in
    /// its last heartbeat and holds a live lease on it from this term.
    pub fn region_leader(&self, region_id: u64) -> Option<(u64, u64)> {
        let inner = self.inner();
        let now = Instant::now();
        inner.nodes.iter().find_map(|(id, node)| {
            let grant = node.region_leases.get(&region_id)?;
            if grant.until <= now {
                return None;
            }
            node.regions
                .iter()
                .find(|s| s.region_id == region_id && s.role == RegionRole::Leader)
                .map(|s| (*id, s.epoch))
        })
    }

    /// What a datanode needs to open the region of `request` at `epoch`: for a Kafka region whether its
    /// `__topic_region` key exists, its checkpoint there with the topic incarnation it counts, and its topic's
    /// pruned entry id (`topics` caches the topics' `__topic_name` values).
    pub async fn region_to_open(
        &self,
        request: &RegionOpenRequest,
        epoch: u64,
        topics: &mut HashMap<String, Option<TopicNameValue>>,
    ) -> Result<RegionToOpen> {
        let mut to_open = RegionToOpen {
            request: request.clone(),
            epoch,
            topic_region_key: false,
            checkpoint: None,
            pruned_entry_id: 0,
            topic_id: None,
            expected_last_entry_id: None,
        };
        if let Some(topic) = kafka_topic(request) {
            to_open.expected_last_entry_id =
                self.inner().closed_at.get(&request.region_id).copied();
            let pool_value = match topics.get(&topic) {
                Some(v) => *v,
                None => {
                    let v = get_topic_value(self.kv.as_ref(), &topic).await?;
                    topics.insert(topic.clone(), v);
                    v
                }
            };
            to_open.pruned_entry_id = pool_value.map_or(0, |v| v.pruned_entry_id);
            let key = topic_region_key(&topic, request.region_id);
            if let Some(found) = self.kv.get(&key).await? {
                let value = TopicRegionValue::decode(&found.key, &found.value)?;
                to_open.topic_region_key = true;
                to_open.checkpoint = value.flushed_entry_id();
                // A checkpoint recorded without an id (by GreptimeDB or an earlier release) is taken to count
                // the incarnation the pool recorded.
                if to_open.checkpoint.is_some() {
                    to_open.topic_id = value.topic_id.or(pool_value.and_then(|v| v.topic_id));
                }
            }
        }
        Ok(to_open)
    }

    /// What the datanode the route names needs to open region `region_id` (`None` when no datanode's table
    /// value lists it).
    pub async fn region_to_open_by_id(
        &self,
        region_id: u64,
    ) -> Result<Option<(u64, RegionToOpen)>> {
        let table_id = table_id_of(region_id);
        let key = table_route_key(table_id);
        let Some(found) = self.kv.get(key.as_bytes()).await? else {
            return Ok(None);
        };
        let route: TableRouteValue = serde_json::from_slice(&found.value).context_decode(&key)?;
        let number = region_number(region_id);
        let Some(datanode_id) = route.region_routes.get(&number).copied() else {
            return Ok(None);
        };
        let open = RegionOpener::new(self.kv.clone(), datanode_id, self.expected)
            .open_regions()
            .await?;
        let Some(request) = open.requests.iter().find(|r| r.region_id == region_id) else {
            return Ok(None);
        };
        let to_open = self
            .region_to_open(request, route.region_epoch(number), &mut HashMap::new())
            .await?;
        Ok(Some((datanode_id, to_open)))
    }

    /// Loads the registration of a heartbeating incarnation this term has not seen (after a failover).
    async fn load_node(&self, request: &HeartbeatRequest) -> Result<()> {
        let datanode_id = request.datanode_id;
        let Some((_, record)) = self.read_record(datanode_id).await? else {
            return DatanodeNotRegisteredSnafu {
                datanode_id,
                incarnation: request.incarnation,
            }
            .fail();
        };
        if request.incarnation < record.incarnation {
            return DatanodeStaleIncarnationSnafu {
                datanode_id,
                incarnation: request.incarnation,
                current: record.incarnation,
            }
            .fail();
        }
        if request.incarnation > record.incarnation {
            return DatanodeNotRegisteredSnafu {
                datanode_id,
                incarnation: request.incarnation,
            }
            .fail();
        }
        snafu::ensure!(
            !record.retired,
            DatanodeRetiredSnafu {
                datanode_id,
                incarnation: request.incarnation,
            }
        );
        let now = Instant::now();
        let interval = Duration::from_millis(request.heartbeat_interval_ms.max(1));
        let mut inner = self.inner();
        let term_start = inner.term_start.unwrap_or(now);
        // Cleared: every earlier incarnation's leases had run out before this one got any, so whatever lease is
        // out there is this incarnation's own. Otherwise a previous leader may have just registered it, while its
        // predecessor's leases still ran: wait that lease out from this term's start.
        let leases_from = if record.cleared {
            now
        } else {
            term_start + Duration::from_millis(record.previous_lease_ms) + LEASE_MARGIN
        };
        inner.nodes.insert(
            datanode_id,
            Node {
                interval,
                record,
                last_heartbeat: None,
                leases_until: None,
                region_leases: HashMap::new(),
                leases_from: leases_from.max(now),
                regions: Vec::new(),
                regions_seq: 0,
                wal_lost: Vec::new(),
                leases: 0,
                detector: PhiAccrualDetector::new(&self.failover, interval),
            },
        );
        Ok(())
    }

    /// Retires incarnation `incarnation` of `datanode_id` before its regions are failed over: its record says
    /// `retired` (compare-and-put), so the failed process, should it come back (a zombie let go), is refused as
    /// stale by every leader and stops, it is not failed over again, and the datanode's next registration is a new
    /// incarnation whose failure is another failover. What this term knew of its leases stays (a moved region's
    /// new leader still waits them out). Returns whether this call retired it (`false`: retired already, or the
    /// record moved on).
    pub async fn retire(&self, datanode_id: u64, incarnation: u64) -> Result<bool> {
        let key = datanode_key(datanode_id);
        let Some((bytes, record)) = self.read_record(datanode_id).await? else {
            return Ok(false);
        };
        if record.incarnation != incarnation || record.retired {
            return Ok(false);
        }
        let retired = DatanodeRecord {
            retired: true,
            ..record
        };
        let response = self
            .kv
            .compare_and_put(CompareAndPutRequest {
                key: key.clone().into_bytes(),
                expect: Some(bytes),
                value: serde_json::to_vec(&retired).unwrap_or_default(),
            })
            .await?;
        snafu::ensure!(
            response.success,
            DatanodeRegistrationContentionSnafu { datanode_id, key }
        );
        let mut inner = self.inner();
        inner.failing_over_until = Some(Instant::now() + FAILOVER_POLL_WINDOW);
        if let Some(node) = inner.nodes.get_mut(&datanode_id)
            && node.record.incarnation == incarnation
        {
            node.record = retired;
        }
        Ok(true)
    }

    /// Records that the incarnation of `request` waited out its predecessors' leases (compare-and-put).
    async fn clear(&self, request: &HeartbeatRequest) -> Result<()> {
        let datanode_id = request.datanode_id;
        let key = datanode_key(datanode_id);
        let Some((bytes, mut record)) = self.read_record(datanode_id).await? else {
            return DatanodeNotRegisteredSnafu {
                datanode_id,
                incarnation: request.incarnation,
            }
            .fail();
        };
        if record.incarnation != request.incarnation {
            return DatanodeStaleIncarnationSnafu {
                datanode_id,
                incarnation: request.incarnation,
                current: record.incarnation,
            }
            .fail();
        }
        if record.cleared {
            return Ok(());
        }
        record.cleared = true;
        let response = self
            .kv
            .compare_and_put(CompareAndPutRequest {
                key: key.clone().into_bytes(),
                expect: Some(bytes),
                value: serde_json::to_vec(&record).unwrap_or_default(),
            })
            .await?;
        snafu::ensure!(
            response.success,
            DatanodeRegistrationContentionSnafu { datanode_id, key }
        );
        Ok(())
    }

    /// Which tables of `regions` a drop is deleting: their route was moved to a tombstone (`DropTable`'s
    /// DeleteMetadata), one batch read. The datanode then answers writes to those regions that the table was
    /// dropped rather than that the region is not open here.
    async fn tables_being_dropped(&self, regions: &[u64]) -> Result<BTreeSet<u32>> {
        let tables: BTreeSet<u32> = regions.iter().map(|r| table_id_of(*r)).collect();
        if tables.is_empty() {
            return Ok(tables);
        }
        let keys: Vec<Vec<u8>> = tables
            .iter()
            .map(|t| tombstone_key(&table_route_key(*t)).into_bytes())
            .collect();
        let found: BTreeSet<Vec<u8>> = self
            .kv
            .batch_get(&keys)
            .await?
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        Ok(tables
            .into_iter()
            .filter(|t| found.contains(tombstone_key(&table_route_key(*t)).as_bytes()))
            .collect())
    }

    /// Moves the checkpoint in the topic-region key `found` (as read) forward to `flushed` (never back), recording
    /// `topic_id` (the incarnation the datanode opened the region on) when known, by compare-and-put against that
    /// value: a key deleted or changed meanwhile is left alone (never created). Returns the checkpoint stored,
    /// `None` when the write did not happen.
    async fn advance_checkpoint(
        &self,
        found: &crate::kv::KeyValue,
        flushed: u64,
        topic_id: Option<TopicId>,
    ) -> Result<Option<u64>> {
        let current = TopicRegionValue::decode(&found.key, &found.value)?;
        let entry_id = current
            .checkpoint
            .map_or(flushed, |c| c.entry_id.max(flushed));
        let next = TopicRegionValue {
            checkpoint: Some(crate::key::topic_region::ReplayCheckpoint {
                entry_id,
                metadata_entry_id: current.checkpoint.and_then(|c| c.metadata_entry_id),
            }),
            topic_id: topic_id.or(current.topic_id),
        };
        let response = self
            .kv
            .compare_and_put(CompareAndPutRequest {
                key: found.key.clone(),
                expect: Some(found.value.clone()),
                value: next.encode(),
            })
            .await?;
        // Lost to a concurrent change: the next heartbeat reads it again.
        Ok(response.success.then_some(entry_id))
    }

    fn decoded(&self) -> std::sync::MutexGuard<'_, Decoded> {
        self.decoded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The dropped regions whose storage is still to be deleted: the `__region_drop` keys, cached while trusted
    /// (the metasrv watches their prefix), up to [`PENDING_DROPS_READ`] of them. A value that does not decode
    /// is left out (with a warning naming its key): it must not stop the heartbeats.
    async fn pending_drops(&self) -> Result<PendingDrops> {
        let generation = self.generation();
        let now = Instant::now();
        if let Some(cached) = &self.decoded().drops
            && cached.trusted(generation, now)
        {
            return Ok(cached.value.clone());
        }
        let mut req = RangeRequest::prefix(REGION_DROP_PREFIX);
        req.limit = PENDING_DROPS_READ;
        let read = self.kv.range(req).await?;
        let mut drops = BTreeMap::new();
        for kv in read.kvs {
            let key = String::from_utf8_lossy(&kv.key);
            let Some(region_id) = parse_region_drop_key(&kv.key) else {
                tracing::warn!(%key, "not a region-drop key; left alone");
                continue;
            };
            match RegionDropValue::decode(&key, &kv.value) {
                Ok(value) => {
                    drops.insert(region_id, value);
                }
                Err(e) => tracing::warn!(error = %e, "a region-drop key left alone"),
            }
        }
        let drops = Arc::new(drops);
        self.decoded().drops = Some(Cached {
            generation,
            read_at: now,
            bytes: (),
            value: drops.clone(),
        });
        Ok(drops)
    }

    /// Deletes the `__region_drop` keys of the regions `request` reports dropped (only those the datanode was the
    /// one to delete): their storage is gone. Returns them. A deposed leader's late delete is harmless: the
    /// datanode deleted the storage before it said so.
    async fn forget_dropped(
        &self,
        request: &HeartbeatRequest,
        drops: &BTreeMap<u64, RegionDropValue>,
    ) -> Result<BTreeSet<u64>> {
        let done: BTreeSet<u64> = request
            .dropped
            .iter()
            .copied()
            .filter(|id| {
                drops
                    .get(id)
                    .is_some_and(|d| d.for_datanode(request.datanode_id))
            })
            .collect();
        if !done.is_empty() {
            let keys: Vec<Vec<u8>> = done
                .iter()
                .map(|id| region_drop_key(*id).into_bytes())
                .collect();
            self.kv.batch_delete(&keys, false).await?;
            tracing::info!(datanode_id = request.datanode_id, regions = ?done, "dropped regions deleted");
        }
        Ok(done)
    }

    /// The write generation now, taken before a read of what it guards.
    fn generation(&self) -> Option<u64> {
        self.generation.as_ref().map(WriteGeneration::current)
    }

    /// What `datanode_id`'s heartbeats are answered from: its regions (from its `__dn_table` records), their
    /// epochs (from their routes) and their topic-region keys. Cached while trusted, otherwise built from what is
    /// read now.
    async fn plan(&self, datanode_id: u64) -> Result<Arc<Plan>> {
        let generation = self.generation();
        let now = Instant::now();
        if let Some(cached) = self.decoded().plans.get(&datanode_id)
            && cached.trusted(generation, now)
        {
            return Ok(cached.value.clone());
        }
        let open = self.assignment(datanode_id).await?;
        let epochs = self.region_epochs(&open.requests).await?;
        let regions: Vec<PlannedRegion> = open
            .requests
            .iter()
            .map(|r| PlannedRegion {
                epoch: epochs.get(&r.region_id).copied().unwrap_or(0),
                topic_region_key: kafka_topic(r).map(|t| topic_region_key(&t, r.region_id)),
            })
            .collect();
        let index = open
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| (r.region_id, i))
            .collect();
        let plan = Arc::new(Plan {
            requests: open.requests,
            regions,
            index,
        });
        self.decoded().plans.insert(
            datanode_id,
            Cached {
                generation,
                read_at: now,
                bytes: (),
                value: plan.clone(),
            },
        );
        Ok(plan)
    }

    /// The open requests of the regions `datanode_id`'s `__dn_table` records give it: cached while trusted,
    /// otherwise read now (and decoded again only when the records' bytes changed).
    async fn assignment(&self, datanode_id: u64) -> Result<Assignment> {
        let generation = self.generation();
        let now = Instant::now();
        if let Some(cached) = self.decoded().assignments.get(&datanode_id)
            && cached.trusted(generation, now)
        {
            return Ok(Assignment {
                requests: cached.value.clone(),
            });
        }
        let opener = RegionOpener::new(self.kv.clone(), datanode_id, self.expected);
        let kvs = opener.scan().await?;
        let same = self
            .decoded()
            .assignments
            .get(&datanode_id)
            .filter(|cached| cached.bytes == kvs)
            .map(|cached| cached.value.clone());
        let requests = match same {
            Some(requests) => requests,
            None => Arc::new(opener.decode(&kvs).requests),
        };
        self.decoded().assignments.insert(
            datanode_id,
            Cached {
                generation,
                read_at: now,
                bytes: kvs,
                value: requests.clone(),
            },
        );
        Ok(Assignment { requests })
    }

    /// The region epochs of `requests`' regions, read from their tables' routes now (decoded again only when a
    /// route's bytes changed; only its `region_epochs` is decoded).
    async fn region_epochs(&self, requests: &[RegionOpenRequest]) -> Result<HashMap<u64, u64>> {
        /// The part of a route a lease needs: its regions' epochs (the rest is skipped, not built).
        #[derive(Deserialize)]
        struct Epochs {
            #[serde(default)]
            region_epochs: BTreeMap<u32, u64>,
        }
        let generation = self.generation();
        let now = Instant::now();
        let tables: BTreeSet<u32> = requests.iter().map(|r| table_id_of(r.region_id)).collect();
        let mut routes: HashMap<u32, RouteEpochs> = HashMap::new();
        let mut keys: Vec<Vec<u8>> = Vec::new();
        {
            let decoded = self.decoded();
            for table in &tables {
                match decoded.epochs.get(table) {
                    Some(cached) if cached.trusted(generation, now) => {
                        routes.insert(*table, cached.value.clone());
                    }
                    _ => keys.push(table_route_key(*table).into_bytes()),
                }
            }
        }
        if !keys.is_empty() {
            for kv in self.kv.batch_get(&keys).await? {
                let key = String::from_utf8_lossy(&kv.key).into_owned();
                let Some(id) = key.rsplit('/').next().and_then(|i| i.parse::<u32>().ok()) else {
                    continue;
                };
                let same = self
                    .decoded()
                    .epochs
                    .get(&id)
                    .filter(|cached| cached.bytes == kv.value)
                    .map(|cached| cached.value.clone());
                let epochs = match same {
                    Some(epochs) => epochs,
                    None => {
                        let route: Epochs =
                            serde_json::from_slice(&kv.value).context_decode(&key)?;
                        Arc::new(route.region_epochs)
                    }
                };
                self.decoded().epochs.insert(
                    id,
                    Cached {
                        generation,
                        read_at: now,
                        bytes: kv.value,
                        value: epochs.clone(),
                    },
                );
                routes.insert(id, epochs);
            }
        }
        Ok(requests
            .iter()
            .map(|r| {
                let epoch = routes
                    .get(&table_id_of(r.region_id))
                    .and_then(|epochs| epochs.get(&region_number(r.region_id)).copied())
                    .unwrap_or(0);
                (r.region_id, epoch)
            })
            .collect())
    }

    /// Every datanode this term knows, by id.
    pub fn list(&self) -> Vec<DatanodeInfo> {
        let inner = self.inner();
        let now = Instant::now();
        inner
            .nodes
            .iter()
            .map(|(id, node)| DatanodeInfo {
                id: *id,
                address: node.record.address.clone(),
                incarnation: node.record.incarnation,
                last_heartbeat_ms: node.last_heartbeat.map(|t| millis(now - t)),
                regions: node.regions.clone(),
                leases: node.leases,
                leases_in_ms: (node.leases_from > now)
                    .then(|| millis(node.leases_from - now).max(1)),
                phi: (node.detector.phi(now) * 100.0).round() / 100.0,
                suspected: self.suspected(&inner, node, now),
                wal_lost: node.wal_lost.clone(),
            })
            .collect()
    }

    /// Whether `node` is suspected at `now`: its phi at or above `[failover] phi_threshold`, once the term's
    /// warm-up (two of its leases from the term's start) has passed, so that a new leader does not suspect
    /// datanodes whose heartbeats have not reached it yet.
    fn suspected(&self, inner: &Inner, node: &Node, now: Instant) -> bool {
        let Some(term_start) = inner.term_start else {
            return false;
        };
        let warm_up = 2 * Duration::from_millis(node.record.lease_ms);
        now >= term_start + warm_up && node.detector.phi(now) >= self.failover.phi_threshold
    }

    /// The datanodes this term suspects now ([`DatanodeInfo::suspected`]), by id.
    pub fn suspects(&self) -> Vec<u64> {
        let inner = self.inner();
        let now = Instant::now();
        inner
            .nodes
            .iter()
            .filter(|(_, node)| self.suspected(&inner, node, now))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The datanodes that heartbeat to this term and are not suspected, by id.
    pub fn live(&self) -> Vec<u64> {
        let inner = self.inner();
        let now = Instant::now();
        inner
            .nodes
            .iter()
            .filter(|(_, node)| node.last_heartbeat.is_some() && !self.suspected(&inner, node, now))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The datanodes whose regions should move, with the incarnation that failed: those this term suspects, and,
    /// once the term's warm-up (two of the longest registered lease from its start) has passed, those registered
    /// (a `__datanode/{id}` record) that never heartbeated to this term. Empty while not leading.
    pub async fn failed(&self) -> Result<Vec<(u64, u64)>> {
        let now = Instant::now();
        let (term_start, mut failed, heard) = {
            let inner = self.inner();
            let Some(term_start) = inner.term_start else {
                return Ok(Vec::new());
            };
            let failed: Vec<(u64, u64)> = inner
                .nodes
                .iter()
                .filter(|(_, node)| !node.record.retired && self.suspected(&inner, node, now))
                .map(|(id, node)| (*id, node.record.incarnation))
                .collect();
            let heard: BTreeSet<u64> = inner
                .nodes
                .iter()
                .filter(|(_, node)| node.last_heartbeat.is_some())
                .map(|(id, _)| *id)
                .collect();
            (term_start, failed, heard)
        };
        let silent: Vec<u64> = self
            .ids
            .iter()
            .copied()
            .filter(|id| !heard.contains(id) && !failed.iter().any(|(f, _)| f == id))
            .collect();
        if silent.is_empty() {
            return Ok(failed);
        }
        let keys: Vec<Vec<u8>> = silent
            .iter()
            .map(|id| datanode_key(*id).into_bytes())
            .collect();
        for kv in self.kv.batch_get(&keys).await? {
            let key = String::from_utf8_lossy(&kv.key).into_owned();
            let record: DatanodeRecord = serde_json::from_slice(&kv.value).context_decode(&key)?;
            let warm_up = 2 * Duration::from_millis(record.lease_ms.max(record.previous_lease_ms));
            if record.retired || now < term_start + warm_up {
                continue;
            }
            if let Some(id) = key.rsplit('/').next().and_then(|i| i.parse::<u64>().ok())
                && self
                    .inner()
                    .nodes
                    .get(&id)
                    .is_none_or(|n| n.last_heartbeat.is_none())
            {
                failed.push((id, record.incarnation));
            }
        }
        failed.sort_unstable();
        Ok(failed)
    }

    /// The address of datanode `id`, if it registered with this term.
    pub fn address(&self, datanode_id: u64) -> Option<String> {
        self.inner()
            .nodes
            .get(&datanode_id)
            .map(|n| n.record.address.clone())
    }
}

#[async_trait::async_trait]
impl crate::ddl::RegionLeadership for DatanodeRegistry {
    async fn region_leader(&self, region_id: u64) -> Option<(u64, u64)> {
        DatanodeRegistry::region_leader(self, region_id)
    }

    async fn live_datanodes(&self) -> Vec<u64> {
        self.live()
    }

    async fn has_failed(&self, datanode_id: u64) -> bool {
        self.inner()
            .nodes
            .get(&datanode_id)
            .is_some_and(|node| node.record.retired)
    }
}

/// The Kafka topic of an open request's WAL options, if it has one.
fn kafka_topic(request: &RegionOpenRequest) -> Option<String> {
    let encoded = request.options.get(WAL_OPTIONS_KEY)?;
    match WalOptions::decode(encoded) {
        Ok(WalOptions::Kafka(k)) => Some(k.topic),
        _ => None,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Decoding a stored JSON value, with the key in the error.
trait DecodeContext<T> {
    fn context_decode(self, key: &str) -> Result<T>;
}

impl<T> DecodeContext<T> for std::result::Result<T, serde_json::Error> {
    fn context_decode(self, key: &str) -> Result<T> {
        Ok(snafu::ResultExt::context(
            self,
            DecodeMetadataSnafu { key },
        )?)
    }
}

/// The regions the route gives a datanode, as open requests.
struct Assignment {
    requests: Arc<Vec<RegionOpenRequest>>,
}

/// One datanode's regions as its heartbeats need them (see [`DatanodeRegistry::plan`]).
#[derive(Debug)]
struct Plan {
    /// The open requests of its regions.
    requests: Arc<Vec<RegionOpenRequest>>,
    /// Per request, in the same order: what a lease needs.
    regions: Vec<PlannedRegion>,
    /// Region id → its index in `requests`.
    index: HashMap<u64, usize>,
}

/// What a lease of one region needs.
#[derive(Debug)]
struct PlannedRegion {
    /// The route's region epoch.
    epoch: u64,
    /// Its `__topic_region` key (`None`: not a Kafka region).
    topic_region_key: Option<Vec<u8>>,
}

/// One region of a table with its leader, as clients route writes by it (`GET /v1/tables/{name}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionLeader {
    /// The region's number in its table.
    pub region_number: u32,
    /// `(table_id << 32) | region_number`.
    pub region_id: u64,
    /// The datanode the route names as its leader.
    pub datanode_id: u64,
    /// That datanode's address, as it last registered (`None` before it ever did).
    pub address: Option<String>,
    /// The region epoch of its route.
    pub epoch: u64,
    /// The encoded WAL options.
    pub wal_options: String,
}

/// A table's regions with their leaders.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableLeaders {
    /// `catalog.schema.table`.
    pub table: String,
    /// The table id.
    pub table_id: u32,
    /// Its regions, by region number.
    pub regions: Vec<RegionLeader>,
}

/// The registered addresses of `datanodes`, read from their `__datanode/{id}` records.
pub async fn registered_addresses(
    kv: &KvBackendRef,
    datanodes: &BTreeSet<u64>,
) -> Result<HashMap<u64, String>> {
    let keys: Vec<Vec<u8>> = datanodes
        .iter()
        .map(|d| datanode_key(*d).into_bytes())
        .collect();
    let mut out = HashMap::new();
    if keys.is_empty() {
        return Ok(out);
    }
    for kv in kv.batch_get(&keys).await? {
        let key = String::from_utf8_lossy(&kv.key).into_owned();
        let record: DatanodeRecord = serde_json::from_slice(&kv.value).context_decode(&key)?;
        if let Some(id) = key.rsplit('/').next().and_then(|i| i.parse::<u64>().ok()) {
            out.insert(id, record.address);
        }
    }
    Ok(out)
}
