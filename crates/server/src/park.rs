//! Parked conversations: the K/V of finished requests, copied off the device, so that a
//! follow-up whose prompt starts with the same tokens reads only what is new. Kept in
//! host memory up to a budget, then spilled to files in a directory up to a second
//! budget, least recently used first; past both, the oldest is dropped. A conversation
//! that extends a parked one replaces it. Matching is on exact token ids, and a file is
//! only used when the tokens it holds equal the ones it was parked under.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use strata_engine::KvSnapshot;
use strata_engine::kv_snapshot::KvSnapshotError;

/// File names of parked conversations end so; only such files are ever removed.
const EXTENSION: &str = "strata-kv";

#[derive(Clone, Debug)]
pub struct ParkConfig {
    /// Host bytes for parked K/V (`--park-mib`).
    pub host_bytes: usize,
    /// Where to spill past the host budget (`--park-dir`); none: drop instead.
    pub dir: Option<PathBuf>,
    /// Bytes of files in `dir` (`--park-disk-mib`).
    pub disk_bytes: usize,
}

enum Place {
    Host(KvSnapshot),
    Disk(PathBuf),
}

struct Entry {
    tokens: Vec<u32>,
    bytes: usize,
    place: Place,
}

/// Where a resumed conversation came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Host,
    Disk,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Host => "host",
            Source::Disk => "disk",
        }
    }
}

/// Counts for /metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParkStats {
    pub host_conversations: usize,
    pub host_bytes: usize,
    pub disk_conversations: usize,
    pub disk_bytes: usize,
}

pub struct ParkStore {
    config: ParkConfig,
    /// Least recently used first.
    entries: Vec<Entry>,
    /// The K/V shape files must have: (layers, elements per position), and most tokens.
    shape: (usize, usize),
    max_tokens: usize,
    next_file: u64,
}

/// How many leading tokens two sequences share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl ParkStore {
    /// A store for snapshots of `shape`; removes parked files a previous run left in the
    /// directory (they are only valid for the process that wrote them).
    pub fn new(
        config: ParkConfig,
        shape: (usize, usize),
        max_tokens: usize,
    ) -> std::io::Result<Self> {
        if let Some(dir) = &config.dir {
            std::fs::create_dir_all(dir)?;
            remove_parked_files(dir);
        }
        Ok(ParkStore {
            config,
            entries: Vec::new(),
            shape,
            max_tokens,
            next_file: 0,
        })
    }

    pub fn stats(&self) -> ParkStats {
        let mut s = ParkStats::default();
        for e in &self.entries {
            match e.place {
                Place::Host(_) => {
                    s.host_conversations += 1;
                    s.host_bytes += e.bytes;
                }
                Place::Disk(_) => {
                    s.disk_conversations += 1;
                    s.disk_bytes += e.bytes;
                }
            }
        }
        s
    }

    /// The parked conversation sharing the longest prefix with `prompt` (the most recent
    /// among equals): its index and the shared length. None when nothing is shared.
    pub fn best_match(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, i))
    }

    /// The snapshot at `index`, read back from its file if it was spilled, and marked as
    /// the most recently used. A file that cannot be read or holds other tokens is
    /// dropped and reported as an error.
    pub fn load(&mut self, index: usize) -> Result<(Cow<'_, KvSnapshot>, Source), KvSnapshotError> {
        if index >= self.entries.len() {
            return Err(KvSnapshotError::BadFile(
                "no such parked conversation".into(),
            ));
        }
        let entry = self.entries.remove(index);
        let read = match &entry.place {
            Place::Host(_) => None,
            Place::Disk(path) => Some(read_file(path, self.shape, self.max_tokens).and_then(
                |snap| {
                    if snap.tokens() == entry.tokens.as_slice() {
                        Ok(snap)
                    } else {
                        Err(KvSnapshotError::BadFile(format!(
                            "{} holds other tokens than were parked",
                            path.display()
                        )))
                    }
                },
            )),
        };
        match read {
            Some(Err(e)) => {
                discard(entry);
                Err(e)
            }
            Some(Ok(snap)) => {
                // Stays on disk (most recent); the copy read is the caller's.
                self.entries.push(entry);
                Ok((Cow::Owned(snap), Source::Disk))
            }
            None => {
                self.entries.push(entry);
                match &self.entries[self.entries.len() - 1].place {
                    Place::Host(snap) => Ok((Cow::Borrowed(snap), Source::Host)),
                    Place::Disk(_) => Err(KvSnapshotError::BadFile("moved".into())),
                }
            }
        }
    }

    /// Parks `snap` as the most recently used, replacing every parked conversation it
    /// extends, then keeps both budgets.
    pub fn park(&mut self, snap: KvSnapshot) {
        if snap.is_empty() {
            return;
        }
        let tokens = snap.tokens().to_vec();
        let (superseded, kept): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut self.entries)
            .into_iter()
            .partition(|e| tokens.starts_with(&e.tokens));
        self.entries = kept;
        superseded.into_iter().for_each(discard);
        let bytes = snap.bytes();
        self.entries.push(Entry {
            tokens,
            bytes,
            place: Place::Host(snap),
        });
        self.keep_budgets();
    }

    /// Spills the oldest host entries to disk while the host budget is exceeded, then
    /// drops the oldest files while the disk budget is.
    fn keep_budgets(&mut self) {
        loop {
            let stats = self.stats();
            if stats.host_bytes <= self.config.host_bytes {
                break;
            }
            let Some(i) = self
                .entries
                .iter()
                .position(|e| matches!(e.place, Place::Host(_)))
            else {
                break;
            };
            self.spill(i);
        }
        loop {
            let stats = self.stats();
            if stats.disk_bytes <= self.config.disk_bytes {
                break;
            }
            let Some(i) = self
                .entries
                .iter()
                .position(|e| matches!(e.place, Place::Disk(_)))
            else {
                break;
            };
            discard(self.entries.remove(i));
        }
    }

    /// Moves entry `i` to a file, or drops it when there is no directory, it alone is
    /// over the disk budget, or writing fails.
    fn spill(&mut self, i: usize) {
        let dir = match &self.config.dir {
            Some(d) if self.entries[i].bytes <= self.config.disk_bytes => d.clone(),
            _ => {
                self.entries.remove(i);
                return;
            }
        };
        let path = dir.join(format!(
            "{}-{}.{EXTENSION}",
            std::process::id(),
            self.next_file
        ));
        self.next_file += 1;
        let written = match &self.entries[i].place {
            Place::Host(snap) => write_file(&path, snap),
            Place::Disk(_) => return,
        };
        match written {
            Ok(()) => self.entries[i].place = Place::Disk(path),
            Err(e) => {
                tracing::warn!("spilling a parked conversation to {}: {e}", path.display());
                let _ = std::fs::remove_file(&path);
                self.entries.remove(i);
            }
        }
    }

    /// Drops everything, removing the files.
    pub fn clear(&mut self) {
        std::mem::take(&mut self.entries)
            .into_iter()
            .for_each(discard);
    }
}

impl Drop for ParkStore {
    fn drop(&mut self) {
        self.clear();
    }
}

fn discard(entry: Entry) {
    if let Place::Disk(path) = entry.place {
        let _ = std::fs::remove_file(path);
    }
}

fn write_file(path: &Path, snap: &KvSnapshot) -> Result<(), KvSnapshotError> {
    let mut w = BufWriter::with_capacity(1 << 20, File::create(path)?);
    snap.write_to(&mut w)?;
    w.flush()?;
    Ok(())
}

fn read_file(
    path: &Path,
    shape: (usize, usize),
    max_tokens: usize,
) -> Result<KvSnapshot, KvSnapshotError> {
    let mut r = BufReader::with_capacity(1 << 20, File::open(path)?);
    KvSnapshot::read_from(&mut r, shape.0, shape.1, max_tokens)
}

fn remove_parked_files(dir: &Path) {
    let Ok(list) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in list.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == EXTENSION) {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A snapshot of `tokens` with the given shape, read from the file format (the only
    /// public way to make one without a device).
    fn snap(tokens: &[u32], layers: usize, row: usize) -> KvSnapshot {
        let mut bytes = b"STRATAKV".to_vec();
        for x in [1u64, layers as u64, row as u64, tokens.len() as u64] {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        for t in tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        for l in 0..layers * 2 {
            for p in 0..tokens.len() * row {
                bytes.extend_from_slice(&((l * 1000 + p) as u16).to_le_bytes());
            }
        }
        KvSnapshot::read_from(&mut bytes.as_slice(), layers, row, 1 << 20).unwrap()
    }

    fn temp_dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("strata-park-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn common_prefix_counts_shared_leading_tokens() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[5], &[1]), 0);
    }

    #[test]
    fn spills_least_recently_used_to_disk_and_reads_it_back() {
        let dir = temp_dir("spill");
        let one = snap(&[1, 2, 3, 4], 2, 8).bytes();
        let mut store = ParkStore::new(
            ParkConfig {
                host_bytes: one * 2,
                dir: Some(dir.clone()),
                disk_bytes: one * 2,
            },
            (2, 8),
            64,
        )
        .unwrap();
        for first in [10u32, 20, 30, 40, 50] {
            store.park(snap(&[first, 2, 3, 4], 2, 8));
        }
        // Two in memory, two on disk, the oldest dropped.
        let s = store.stats();
        assert_eq!(
            (s.host_conversations, s.disk_conversations),
            (2, 2),
            "{s:?}"
        );
        assert!(store.best_match(&[10, 2, 3]).is_none());
        // 20 was spilled: it comes back from disk, equal to what was parked.
        let (i, n) = store.best_match(&[20, 2, 3, 9]).unwrap();
        assert_eq!(n, 3);
        let (got, source) = store.load(i).unwrap();
        assert_eq!(source, Source::Disk);
        assert_eq!(*got, snap(&[20, 2, 3, 4], 2, 8));
        let (i, _) = store.best_match(&[50, 2]).unwrap();
        assert_eq!(store.load(i).unwrap().1, Source::Host);
        // A file changed behind the store's back is refused, not served.
        let (i, _) = store.best_match(&[30, 2]).unwrap();
        if let Place::Disk(p) = &store.entries[i].place {
            std::fs::write(p, b"garbage").unwrap();
        } else {
            panic!("30 should be on disk");
        }
        assert!(store.load(i).is_err());
        assert!(store.best_match(&[30, 2]).is_none());
        // A conversation extending 50's replaces it.
        store.park(snap(&[50, 2, 3, 4, 5], 2, 8));
        assert_eq!(
            store.entries.iter().filter(|e| e.tokens[0] == 50).count(),
            1
        );
        drop(store);
        let left = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(left, 0, "parked files left after drop");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn without_a_directory_the_oldest_is_dropped() {
        let one = snap(&[1, 2], 1, 4).bytes();
        let mut store = ParkStore::new(
            ParkConfig {
                host_bytes: one,
                dir: None,
                disk_bytes: 0,
            },
            (1, 4),
            64,
        )
        .unwrap();
        store.park(snap(&[1, 2], 1, 4));
        store.park(snap(&[3, 4], 1, 4));
        assert!(store.best_match(&[1, 2]).is_none());
        assert_eq!(store.best_match(&[3, 4, 5]), Some((0, 2)));
        assert_eq!(store.stats().host_conversations, 1);
    }
}
