//! The storage seam: every byte the journal reads or writes goes through
//! [`Storage`] and [`StorageFile`].
//!
//! The trait is deliberately small (positional reads and writes, `fdatasync`,
//! truncate, rename, directory sync) so that a fault-injecting implementation
//! (`journal::sim::SimStorage`, built for tests and the `testing` feature)
//! can model exactly what a crash keeps: only bytes and directory entries
//! that were synced.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

/// A file system the journal can live on.
pub trait Storage: Send + Sync + 'static {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names (not paths) of the regular files directly inside `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>>;
    /// Creates a new empty file; fails if it exists. The name is durable only
    /// after [`Storage::sync_dir`].
    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Atomically replaces `to` with `from`; durable after `sync_dir`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes creations, renames and removals in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// One open file.
pub trait StorageFile: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read
    /// (fewer only at end of file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`: the file's bytes so far survive a crash.
    fn sync_data(&self) -> io::Result<()>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    fn size_bytes(&self) -> io::Result<u64>;

    /// Reads exactly `buf.len()` bytes at `offset` or fails with
    /// `UnexpectedEof`.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
            }
        }
        Ok(())
    }

    /// Reads the whole file into `out` (cleared first).
    fn read_all(&self, out: &mut Vec<u8>) -> io::Result<()> {
        let len = self.size_bytes()? as usize;
        out.clear();
        out.resize(len, 0);
        let mut filled = 0;
        while filled < len {
            match self.read_at(&mut out[filled..], filled as u64)? {
                0 => break,
                n => filled += n,
            }
        }
        out.truncate(filled);
        Ok(())
    }
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct OsStorage;

impl Storage for OsStorage {
    /// Creates the spool directory readable by its owner only (`0700`):
    /// payloads may hold anything the application sends.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(names)
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Arc::new(OsFile(file)))
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        Ok(Arc::new(OsFile(file)))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

struct OsFile(File);

impl StorageFile for OsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        loop {
            match self.0.read_at(buf, offset) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    /// Reads through the file cursor so that the buffer need not be zeroed
    /// first (replay reads whole segments). Only the scanner reads this way,
    /// on handles of its own; everything else uses positional I/O.
    fn read_all(&self, out: &mut Vec<u8>) -> io::Result<()> {
        out.clear();
        let mut file = &self.0;
        file.seek(SeekFrom::Start(0))?;
        file.read_to_end(out)?;
        Ok(())
    }
}
