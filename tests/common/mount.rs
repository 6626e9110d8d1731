//! A tmpfs mounted for a test (root only; `.ci/run` runs as root): a
//! real file system that fills up.

use std::process::Command;

pub struct Mount(pub std::path::PathBuf);

impl Mount {
    pub fn tmpfs(dir: &std::path::Path, size: &str) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .expect("mount(8) runs");
        assert!(
            out.status.success(),
            "mounting a tmpfs needs root (as .ci/run has): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Mount(dir.to_path_buf())
    }

    pub fn resize(&self, size: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
