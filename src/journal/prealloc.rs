//! Zero-filled spare segments, prepared ahead of need.
//!
//! On ext4 (and most file systems) an `fdatasync` after an append must also
//! commit the file's new size, a metadata journal write; an `fdatasync` after
//! overwriting blocks that already hold zeros flushes only the data. Measured
//! here: 64 KiB write + fdatasync ≈ 370 µs appending, ≈ 190 µs into a
//! zero-filled file. So a helper thread keeps one spare file, zero-filled to
//! `segment_bytes` and fsynced, for the writer to rename into place at its
//! next rotation; writing the zeros never stalls an append.
//!
//! Spares are named `prealloc-<n>.tmp`; start-up deletes leftovers. Replay
//! treats the zeros after a segment's last record as free space.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::storage::Storage;

/// Zeros written, and made durable, per step while filling a spare. A
/// device flush covers everything written before it, so the writer's own
/// `fdatasync` waits for whatever zeros are in flight: one flush of a whole
/// 64 MiB spare took ~27 ms here (strace), a 4 MiB step several ms, which
/// set the p99 of sends. Small steps keep each wait short.
const FILL_CHUNK_BYTES: usize = 256 << 10;

/// A pause between steps, so that zero-filling takes a share of the disk
/// rather than all of it: 256 steps of a 64 MiB spare take at least a
/// quarter second, well under the time the writer takes to fill a segment.
const STEP_PAUSE: Duration = Duration::from_millis(1);

#[derive(Default)]
struct State {
    ready: Option<PathBuf>,
    wanted: bool,
    closed: bool,
    made: u64,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// The handle the writer holds. Dropping it stops the helper thread.
pub(crate) struct Preallocator {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Preallocator {
    pub(crate) fn start(storage: Arc<dyn Storage>, dir: &Path, segment_bytes: u64) -> Preallocator {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                wanted: true,
                ..State::default()
            }),
            wake: Condvar::new(),
        });
        let dir = dir.to_path_buf();
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("journal-prealloc".into())
                .spawn(move || run(&shared, storage.as_ref(), &dir, segment_bytes))
                .ok()
        };
        Preallocator { shared, thread }
    }

    /// A ready spare, if there is one; asks for the next either way. With
    /// `wait` (start-up only), waits for the one being made, unless making
    /// it failed.
    pub(crate) fn take(&self, wait: bool) -> Option<PathBuf> {
        let mut state = self.shared.state.lock().expect("prealloc lock poisoned");
        while wait
            && state.ready.is_none()
            && state.wanted
            && !state.closed
            && self.thread.is_some()
        {
            state = self
                .shared
                .wake
                .wait(state)
                .expect("prealloc lock poisoned");
        }
        state.wanted = true;
        let spare = state.ready.take();
        drop(state);
        self.shared.wake.notify_all();
        spare
    }
}

impl Drop for Preallocator {
    fn drop(&mut self) {
        self.shared
            .state
            .lock()
            .expect("prealloc lock poisoned")
            .closed = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(shared: &Shared, storage: &dyn Storage, dir: &Path, segment_bytes: u64) {
    loop {
        let n = {
            let mut state = shared.state.lock().expect("prealloc lock poisoned");
            while !state.closed && (!state.wanted || state.ready.is_some()) {
                state = shared.wake.wait(state).expect("prealloc lock poisoned");
            }
            if state.closed {
                return;
            }
            state.made += 1;
            state.made
        };
        let path = dir.join(format!("prealloc-{n}.tmp"));
        let stopping = || shared.state.lock().expect("prealloc lock poisoned").closed;
        // The first spare is the one start-up waits for, with no traffic
        // yet to share the disk with: no pauses.
        let pause = if n == 1 { Duration::ZERO } else { STEP_PAUSE };
        match fill(storage, &path, segment_bytes, pause, stopping) {
            Ok(false) => {
                // Stopped half-way: the spare is useless.
                let _ = storage.remove(&path);
                return;
            }
            Ok(true) => {
                let mut state = shared.state.lock().expect("prealloc lock poisoned");
                if state.closed {
                    drop(state);
                    let _ = storage.remove(&path);
                    return;
                }
                state.ready = Some(path);
                state.wanted = false;
                shared.wake.notify_all();
            }
            Err(e) => {
                // The writer falls back to appending; it asks again at its
                // next rotation.
                tracing::warn!(error = %e, "cannot preallocate a segment; appending instead");
                let _ = storage.remove(&path);
                shared.state.lock().expect("prealloc lock poisoned").wanted = false;
                shared.wake.notify_all();
            }
        }
    }
}

/// Fills `path` with `segment_bytes` of durable zeros, pausing between
/// steps; `false` if `stopping` said so before the end.
fn fill(
    storage: &dyn Storage,
    path: &Path,
    segment_bytes: u64,
    pause: Duration,
    stopping: impl Fn() -> bool,
) -> std::io::Result<bool> {
    let file = storage.create(path)?;
    let zeros = vec![0u8; FILL_CHUNK_BYTES];
    let mut off = 0u64;
    while off < segment_bytes {
        if stopping() {
            return Ok(false);
        }
        let n = (segment_bytes - off).min(FILL_CHUNK_BYTES as u64) as usize;
        file.write_all_at(&zeros[..n], off)?;
        file.sync_data()?;
        off += n as u64;
        std::thread::sleep(pause);
    }
    Ok(true)
}

/// Deletes temp files a crash left behind (`*.tmp`): spares, and a spool
/// identity whose creation never finished.
pub(crate) fn sweep_temp_files(storage: &dyn Storage, dir: &Path) -> std::io::Result<usize> {
    let mut removed = 0;
    for name in storage.list(dir)? {
        if name.ends_with(".tmp") {
            storage.remove(&dir.join(&name))?;
            removed += 1;
        }
    }
    if removed > 0 {
        storage.sync_dir(dir)?;
    }
    Ok(removed)
}
