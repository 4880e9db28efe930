//! The key locks every writer of the PostgreSQL metadata store takes: how transactions that compare and write
//! keys are serialized without `SERIALIZABLE` and its aborts.
//!
//! Every statement that writes the pairs table runs in a `READ COMMITTED` transaction that first takes, in one
//! statement, transaction-scoped advisory locks:
//!
//! - the **table lock** `all`, shared by every writer that names its keys, exclusive for a writer whose keys are
//!   not known up front (a range delete) or too many to lock one by one (more than [`MAX_KEY_LOCKS`]);
//! - then one lock per key, by a 64-bit hash of the table and the key, in ascending order: **exclusive** for a key
//!   the transaction writes (puts or deletes, in either branch), **shared** for a key it only reads (compares,
//!   gets, a previous value).
//!
//! It reads only after the locks are granted; at `READ COMMITTED` that read's snapshot then holds every write of
//! those keys committed before, and no transaction can change them until this one ends. So each transaction is
//! strict two-phase locking over the keys it touches, which makes the committed outcome that of the order in which
//! the transactions took their locks — serial, and in time (a write that passed its compare commits before any
//! change of a key it compared). The cases `SERIALIZABLE` covered by predicate locks are covered too: a key found
//! *absent* is locked by its hash whether or not a row exists, so a put-if-absent and a racing creation of the key
//! take turns. Conflicting writers wait for each other instead of being aborted and run again: nothing is retried,
//! and writers of different keys never wait (hash collisions aside, which only make two writers take turns).
//!
//! Locks are taken in one order (the table lock first, then by id), so two writers never wait for each other in a
//! cycle. Single-statement reads (`get`, `range`, `batch_get`) take no lock: each sees the writes committed before
//! it began, as on etcd.
//!
//! The leader election's takeover rewrites the leader key with the same locks (`crate::metasrv::election`), which
//! is what makes that key a fence: a takeover waits for every write that compared the old leader's key to end.

use std::collections::BTreeMap;

/// At most this many key locks in one transaction; a transaction touching more keys takes the table lock
/// exclusively instead (PostgreSQL's lock table is shared and bounded: `max_locks_per_transaction` ×
/// connections).
pub const MAX_KEY_LOCKS: usize = 256;

/// The statement taking a [`LockSet`]: parameters `$1` the lock ids in order, `$2` whether each is exclusive. A
/// function scan yields the array in order, so the locks are taken in the order given.
pub(crate) const LOCK_SQL: &str = "SELECT count(*) FROM (SELECT CASE WHEN x THEN pg_advisory_xact_lock(id) \
     ELSE pg_advisory_xact_lock_shared(id) END FROM unnest($1::int8[], $2::bool[]) AS l(id, x)) s";

/// The advisory locks one transaction takes, in the order it takes them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct LockSet {
    /// Lock ids: the table lock first, then key locks ascending.
    pub ids: Vec<i64>,
    /// Whether each lock of `ids` is exclusive.
    pub exclusive: Vec<bool>,
}

/// Lock ids of one pairs table.
#[derive(Debug, Clone)]
pub(crate) struct TableLocks {
    /// The table's `"schema"."table"`, hashed into every id so two tables in one database do not share locks.
    table: String,
}

impl TableLocks {
    /// The locks of the pairs table `table` (`"schema"."table"`).
    pub fn new(table: &str) -> Self {
        TableLocks {
            table: table.to_string(),
        }
    }

    /// The table lock's id.
    pub fn all(&self) -> i64 {
        hash(&self.table, b"", 1)
    }

    /// The lock id of `key`.
    pub fn key(&self, key: &[u8]) -> i64 {
        hash(&self.table, key, 0)
    }

    /// The locks of a transaction writing `written` and reading `read` (a key in both is written).
    pub fn of<'a>(
        &self,
        written: impl IntoIterator<Item = &'a [u8]>,
        read: impl IntoIterator<Item = &'a [u8]>,
    ) -> LockSet {
        let mut keys: BTreeMap<i64, bool> = BTreeMap::new();
        for key in read {
            keys.entry(self.key(key)).or_insert(false);
        }
        for key in written {
            keys.insert(self.key(key), true);
        }
        if keys.len() > MAX_KEY_LOCKS {
            return self.whole_table();
        }
        let mut set = LockSet {
            ids: vec![self.all()],
            exclusive: vec![false],
        };
        for (id, exclusive) in keys {
            set.ids.push(id);
            set.exclusive.push(exclusive);
        }
        set
    }

    /// The table lock alone, exclusive: for a writer whose keys are not known up front.
    pub fn whole_table(&self) -> LockSet {
        LockSet {
            ids: vec![self.all()],
            exclusive: vec![true],
        }
    }
}

/// FNV-1a (64 bits) of the table, a separator, `kind` and the key: stable across processes and releases, as every
/// writer of one table must agree on it.
fn hash(table: &str, key: &[u8], kind: u8) -> i64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for byte in table.as_bytes().iter().chain(&[0xff, kind]).chain(key) {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(PRIME);
    }
    h as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lock_comes_first_then_keys_ascending_a_written_key_exclusive() {
        let locks = TableLocks::new("\"public\".\"kv\"");
        let set = locks.of([b"b".as_slice()], [b"a".as_slice(), b"b".as_slice()]);
        assert_eq!(set.ids[0], locks.all());
        assert!(!set.exclusive[0]);
        let mut keys = vec![(locks.key(b"a"), false), (locks.key(b"b"), true)];
        keys.sort();
        assert_eq!(
            set.ids[1..]
                .iter()
                .copied()
                .zip(set.exclusive[1..].iter().copied())
                .collect::<Vec<_>>(),
            keys
        );
    }

    #[test]
    fn too_many_keys_take_the_whole_table_and_tables_do_not_share_ids() {
        let locks = TableLocks::new("\"public\".\"kv\"");
        let keys: Vec<Vec<u8>> = (0..=MAX_KEY_LOCKS)
            .map(|i| i.to_string().into_bytes())
            .collect();
        let set = locks.of(keys.iter().map(Vec::as_slice), []);
        assert_eq!(set, locks.whole_table());
        assert_ne!(
            locks.key(b"k"),
            TableLocks::new("\"public\".\"other\"").key(b"k")
        );
        assert_ne!(locks.key(b""), locks.all());
    }
}
