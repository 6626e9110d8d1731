//! A fault-injecting, in-memory [`Storage`] for tests (compiled only for
//! unit tests and with the `testing` feature: never in a release binary).
//!
//! It models what a crash keeps and nothing more: a file's bytes survive only
//! up to its last `sync_data`, and a directory entry (creation, rename,
//! removal) only after `sync_dir`. On top of that it can tear the last
//! unsynced write (keep a prefix of it), fail a chosen write (after writing a
//! part of it, as a full disk does) or a chosen fsync, slow every fsync
//! down, and cap the total size of the "disk". Injected write and fsync
//! failures skip the preallocation thread and all-zero writes (rollback), so
//! a test aims them at the journal's next batch (or a compaction).
//!
//! After [`SimStorage::crash`] every handle opened before the crash fails, as
//! a dead process's file descriptors would.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::storage::{Storage, StorageFile};

#[derive(Debug, Default)]
struct FileData {
    /// What a reader sees now.
    current: Vec<u8>,
    /// What survives a crash.
    durable: Vec<u8>,
}

#[derive(Debug)]
struct Node {
    data: Mutex<FileData>,
}

#[derive(Debug, Default)]
struct Faults {
    /// Fail the write this many writes from now (0 = the next one).
    write_countdown: Option<u64>,
    write_error: Option<io::ErrorKind>,
    sync_countdown: Option<u64>,
    /// Total bytes all files may hold; a write beyond it fails with ENOSPC
    /// after writing what fits.
    capacity_bytes: Option<u64>,
    /// Every `sync_data` takes this long (a slow disk).
    sync_delay: Option<std::time::Duration>,
    /// Power is cut after this many more changes (creates, writes, syncs,
    /// truncates, renames, removals, directory syncs): every later change
    /// fails, as if the machine were gone, until [`SimStorage::crash`].
    power_countdown: Option<u64>,
}

#[derive(Debug, Default)]
struct SimState {
    /// The namespace a running process sees.
    names: HashMap<PathBuf, Arc<Node>>,
    /// The namespace as of the last directory sync.
    durable_names: HashMap<PathBuf, Arc<Node>>,
    faults: Faults,
    /// Set on the handles of the generation before the last crash.
    generation: Arc<AtomicBool>,
    writes: u64,
    syncs: u64,
}

/// See the module docs. Cloning shares the same simulated disk.
#[derive(Debug, Clone, Default)]
pub struct SimStorage {
    state: Arc<Mutex<SimState>>,
}

/// How a crash treats the bytes written after the last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tear {
    /// Every unsynced byte is lost.
    DropUnsynced,
    /// Of the unsynced bytes appended to a file, the first `n` survive
    /// (clamped to what was written), as when a write was cut short.
    KeepPrefix(u64),
    /// The unsynced change is cut into pages of `page_bytes`; page `i`
    /// reaches the disk when bit `i % 64` of `mask` is set: any subset of
    /// a write's pages, holes included, as a disk may persist them.
    Pages { page_bytes: u64, mask: u64 },
}

impl SimStorage {
    pub fn new() -> SimStorage {
        SimStorage::default()
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        self.state.lock().expect("sim storage lock poisoned")
    }

    /// Simulates power loss: keeps only what was synced, torn as `tear` says.
    pub fn crash(&self, tear: Tear) {
        let mut state = self.lock();
        state.generation.store(true, Ordering::SeqCst);
        state.generation = Arc::new(AtomicBool::new(false));
        let mut survivors = HashMap::new();
        for (path, node) in &state.durable_names {
            let data = node.data.lock().expect("sim file lock poisoned");
            let mut kept = data.durable.clone();
            // The unsynced change starts at the first byte that differs
            // (an append, or an overwrite of preallocated zeros).
            let (cur, dur) = (&data.current, &data.durable);
            let first_diff = cur
                .iter()
                .zip(dur.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(cur.len().min(dur.len()));
            let mut keep = |from: usize, to: usize| {
                let to = to.min(cur.len());
                if to > from {
                    if kept.len() < to {
                        kept.resize(to, 0);
                    }
                    kept[from..to].copy_from_slice(&cur[from..to]);
                }
            };
            match tear {
                Tear::DropUnsynced => {}
                // Keep the change's first `n` bytes.
                Tear::KeepPrefix(n) => keep(first_diff, first_diff + n as usize),
                Tear::Pages { page_bytes, mask } => {
                    let page = page_bytes.max(1) as usize;
                    let mut i = 0;
                    let mut from = first_diff;
                    while from < cur.len() {
                        if mask >> (i % 64) & 1 == 1 {
                            keep(from, from + page);
                        }
                        from += page;
                        i += 1;
                    }
                }
            }
            let fresh = Node {
                data: Mutex::new(FileData {
                    durable: kept.clone(),
                    current: kept,
                }),
            };
            survivors.insert(path.clone(), Arc::new(fresh));
        }
        state.names = survivors.clone();
        state.durable_names = survivors;
        state.faults = Faults::default();
    }

    /// The write `n` writes from now (0 = the next) writes half its bytes and
    /// fails with `kind`.
    pub fn fail_write(&self, n: u64, kind: io::ErrorKind) {
        let mut state = self.lock();
        state.faults.write_countdown = Some(n);
        state.faults.write_error = Some(kind);
    }

    /// The `sync_data` `n` syncs from now (0 = the next) fails with EIO and
    /// makes nothing durable.
    pub fn fail_sync(&self, n: u64) {
        self.lock().faults.sync_countdown = Some(n);
    }

    /// Caps the total bytes of all files (a full disk).
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.lock().faults.capacity_bytes = bytes;
    }

    /// Cuts the power after `n` more changes (0: the next one fails): every
    /// change from then on fails, until [`SimStorage::crash`] (which a
    /// test calls next) brings the disk back with what was synced.
    pub fn cut_power_after(&self, n: u64) {
        self.lock().faults.power_countdown = Some(n);
    }

    /// True once a power cut set with [`SimStorage::cut_power_after`]
    /// happened.
    pub fn power_is_cut(&self) -> bool {
        self.lock().faults.power_countdown == Some(0)
    }

    /// Makes every `sync_data` take `delay`, as on a slow disk.
    pub fn set_sync_delay(&self, delay: Option<std::time::Duration>) {
        self.lock().faults.sync_delay = delay;
    }

    /// Bytes all files hold now.
    pub fn total_bytes(&self) -> u64 {
        SimStorage::used_bytes(&self.lock())
    }

    /// Clears every pending fault.
    pub fn heal(&self) {
        self.lock().faults = Faults::default();
    }

    /// How many `sync_data` calls succeeded so far (group-commit tests).
    pub fn sync_count(&self) -> u64 {
        self.lock().syncs
    }

    pub fn write_count(&self) -> u64 {
        self.lock().writes
    }

    /// The current bytes of a file, for corruption tests.
    pub fn file_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.lock();
        let node = state.names.get(path)?;
        let data = node.data.lock().expect("sim file lock poisoned");
        Some(data.current.clone())
    }

    /// Replaces a file's bytes (current and durable), for corruption tests.
    pub fn set_file_bytes(&self, path: &Path, bytes: Vec<u8>) {
        let mut state = self.lock();
        let node = Arc::new(Node {
            data: Mutex::new(FileData {
                current: bytes.clone(),
                durable: bytes,
            }),
        });
        state.names.insert(path.to_path_buf(), node.clone());
        state.durable_names.insert(path.to_path_buf(), node);
    }

    fn used_bytes(state: &SimState) -> u64 {
        state
            .names
            .values()
            .map(|n| n.data.lock().expect("sim file lock poisoned").current.len() as u64)
            .sum()
    }
}

/// Counts one change against a pending power cut; an error once the power
/// is gone. Changes on the preallocation thread do not count (it runs at
/// its own pace), but fail all the same once the power is gone.
fn spend_power(state: &mut SimState) -> io::Result<()> {
    match state.faults.power_countdown {
        Some(0) => Err(io::Error::other("sim: power cut")),
        Some(n) if !on_prealloc_thread() => {
            state.faults.power_countdown = Some(n - 1);
            Ok(())
        }
        _ => Ok(()),
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

impl Storage for SimStorage {
    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let state = self.lock();
        Ok(state
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect())
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let state = self.lock();
        let node = state.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(Arc::new(SimFile {
            node: node.clone(),
            sim: self.clone(),
            dead: state.generation.clone(),
        }))
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let mut state = self.lock();
        spend_power(&mut state)?;
        if state.names.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}: exists", path.display()),
            ));
        }
        let node = Arc::new(Node {
            data: Mutex::new(FileData::default()),
        });
        state.names.insert(path.to_path_buf(), node.clone());
        Ok(Arc::new(SimFile {
            node,
            sim: self.clone(),
            dead: state.generation.clone(),
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        spend_power(&mut state)?;
        state
            .names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock();
        spend_power(&mut state)?;
        let node = state.names.remove(from).ok_or_else(|| not_found(from))?;
        state.names.insert(to.to_path_buf(), node);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.lock();
        spend_power(&mut state)?;
        let state = &mut *state;
        state.durable_names.retain(|p, _| p.parent() != Some(dir));
        for (path, node) in &state.names {
            if path.parent() == Some(dir) {
                state.durable_names.insert(path.clone(), node.clone());
            }
        }
        Ok(())
    }
}

/// The preallocation helper fills spares at its own pace; a fault injected
/// for "the next write" must not land there by chance.
fn on_prealloc_thread() -> bool {
    std::thread::current().name() == Some("journal-prealloc")
}

struct SimFile {
    node: Arc<Node>,
    sim: SimStorage,
    /// True once the simulated process that opened this handle has crashed.
    dead: Arc<AtomicBool>,
}

impl SimFile {
    fn check_alive(&self) -> io::Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(io::Error::other("sim: handle from before a crash"));
        }
        Ok(())
    }
}

impl StorageFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.check_alive()?;
        let data = self.node.data.lock().expect("sim file lock poisoned");
        let start = (offset as usize).min(data.current.len());
        let n = buf.len().min(data.current.len() - start);
        buf[..n].copy_from_slice(&data.current[start..start + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_alive()?;
        let mut state = self.sim.lock();
        spend_power(&mut state)?;
        state.writes += 1;
        let mut write_len = buf.len();
        let mut error = None;
        // Injected write faults aim at writes that carry data: zero fills
        // (preallocation, rollback) run on other threads at other times.
        let carries_data = buf.iter().any(|&b| b != 0) && !on_prealloc_thread();
        if let Some(n) = state.faults.write_countdown.filter(|_| carries_data) {
            if n == 0 {
                state.faults.write_countdown = None;
                let kind = state
                    .faults
                    .write_error
                    .take()
                    .unwrap_or(io::ErrorKind::Other);
                write_len = buf.len() / 2;
                error = Some(io::Error::new(kind, "sim: injected write failure"));
            } else {
                state.faults.write_countdown = Some(n - 1);
            }
        }
        if let Some(cap) = state.faults.capacity_bytes {
            let used = SimStorage::used_bytes(&state);
            let file_len = self
                .node
                .data
                .lock()
                .expect("sim file lock poisoned")
                .current
                .len();
            let growth = (offset as usize + write_len).saturating_sub(file_len) as u64;
            if used + growth > cap {
                let room = cap.saturating_sub(used) as usize;
                let fits = (file_len + room).saturating_sub(offset as usize);
                write_len = write_len.min(fits);
                error = Some(io::Error::new(io::ErrorKind::StorageFull, "sim: disk full"));
            }
        }
        drop(state);
        let mut data = self.node.data.lock().expect("sim file lock poisoned");
        let end = offset as usize + write_len;
        if data.current.len() < end {
            data.current.resize(end, 0);
        }
        data.current[offset as usize..end].copy_from_slice(&buf[..write_len]);
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn sync_data(&self) -> io::Result<()> {
        self.check_alive()?;
        let mut state = self.sim.lock();
        spend_power(&mut state)?;
        if let Some(n) = state
            .faults
            .sync_countdown
            .filter(|_| !on_prealloc_thread())
        {
            if n == 0 {
                state.faults.sync_countdown = None;
                return Err(io::Error::other("sim: injected fsync failure"));
            }
            state.faults.sync_countdown = Some(n - 1);
        }
        state.syncs += 1;
        let delay = state.faults.sync_delay;
        drop(state);
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        let mut data = self.node.data.lock().expect("sim file lock poisoned");
        data.durable = data.current.clone();
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.check_alive()?;
        spend_power(&mut self.sim.lock())?;
        let mut data = self.node.data.lock().expect("sim file lock poisoned");
        data.current.resize(len as usize, 0);
        Ok(())
    }

    fn size_bytes(&self) -> io::Result<u64> {
        self.check_alive()?;
        let data = self.node.data.lock().expect("sim file lock poisoned");
        Ok(data.current.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        PathBuf::from("/spool")
    }

    #[test]
    fn crash_keeps_only_synced_bytes_and_names() {
        let sim = SimStorage::new();
        let a = sim.create(&dir().join("a")).unwrap();
        a.write_all_at(b"hello", 0).unwrap();
        a.sync_data().unwrap();
        sim.sync_dir(&dir()).unwrap();
        a.write_all_at(b" world", 5).unwrap();
        let b = sim.create(&dir().join("b")).unwrap();
        b.write_all_at(b"lost", 0).unwrap();
        b.sync_data().unwrap();

        sim.crash(Tear::DropUnsynced);
        assert!(a.size_bytes().is_err(), "old handles die with the process");
        assert_eq!(sim.file_bytes(&dir().join("a")).unwrap(), b"hello");
        assert!(
            sim.file_bytes(&dir().join("b")).is_none(),
            "b's name was never synced"
        );
    }

    #[test]
    fn tear_keeps_a_prefix_of_the_unsynced_tail() {
        let sim = SimStorage::new();
        let a = sim.create(&dir().join("a")).unwrap();
        sim.sync_dir(&dir()).unwrap();
        a.write_all_at(b"abc", 0).unwrap();
        a.sync_data().unwrap();
        a.write_all_at(b"defgh", 3).unwrap();
        sim.crash(Tear::KeepPrefix(2));
        assert_eq!(sim.file_bytes(&dir().join("a")).unwrap(), b"abcde");
    }

    #[test]
    fn a_page_tear_keeps_any_subset_of_the_unsynced_pages() {
        let sim = SimStorage::new();
        let a = sim.create(&dir().join("a")).unwrap();
        sim.sync_dir(&dir()).unwrap();
        a.write_all_at(b"ab", 0).unwrap();
        a.sync_data().unwrap();
        a.write_all_at(b"cdefgh", 2).unwrap();
        // Pages "cd", "ef", "gh": the first and last reach the disk.
        sim.crash(Tear::Pages {
            page_bytes: 2,
            mask: 0b101,
        });
        assert_eq!(sim.file_bytes(&dir().join("a")).unwrap(), b"abcd\0\0gh");
    }

    #[test]
    fn a_power_cut_fails_every_later_change() {
        let sim = SimStorage::new();
        let a = sim.create(&dir().join("a")).unwrap();
        sim.cut_power_after(1);
        a.write_all_at(b"one", 0).unwrap();
        assert!(a.sync_data().is_err());
        assert!(sim.rename(&dir().join("a"), &dir().join("b")).is_err());
        assert!(sim.power_is_cut());
        sim.crash(Tear::DropUnsynced);
        assert!(sim.create(&dir().join("c")).is_ok(), "power is back");
    }

    #[test]
    fn injected_faults_fire_once() {
        let sim = SimStorage::new();
        let a = sim.create(&dir().join("a")).unwrap();
        sim.fail_write(1, io::ErrorKind::StorageFull);
        a.write_all_at(b"1234", 0).unwrap();
        let err = a.write_all_at(b"5678", 4).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert_eq!(
            a.size_bytes().unwrap(),
            6,
            "half of the failed write landed"
        );
        sim.fail_sync(0);
        assert!(a.sync_data().is_err());
        assert!(a.sync_data().is_ok());
    }

    #[test]
    fn capacity_fills_up() {
        let sim = SimStorage::new();
        sim.set_capacity(Some(10));
        let a = sim.create(&dir().join("a")).unwrap();
        a.write_all_at(&[1; 8], 0).unwrap();
        let err = a.write_all_at(&[2; 8], 8).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert_eq!(a.size_bytes().unwrap(), 10);
    }
}
