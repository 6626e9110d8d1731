//! The corruption matrix, through the real binary: a spool written by
//! `spoold run` is stopped, damaged on disk in one way per row, and then
//! `spoold run`, `spoold journal verify` and `spoold journal repair` must
//! each end in the outcome of the recovery table in
//! docs/journal-format.md: truncate, refuse naming file and offset, or
//! quarantine and keep every good record.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::common::process::{client, messages_in, queue_json, start_config, write_config};
use reqwest::StatusCode;
use spoold::testing::kind;
use spoold::testing::{FILE_HEADER_BYTES, FRAME_HEADER_BYTES, FrameHeader};

const SPOOL_KEYS: &str = "segment_bytes = \"64KiB\"";
const QUARANTINE_KEYS: &str = "segment_bytes = \"64KiB\"\non_corruption = \"quarantine\"";
const TABLES: &str = "[queues.q]\n";
const MESSAGES: usize = 700;

/// One frame of a segment file.
#[derive(Debug, Clone, Copy)]
struct Frame {
    offset: usize,
    len: usize,
    kind: u8,
}

/// A spool written by the binary, to be copied for each row.
struct Template {
    dir: tempfile::TempDir,
    /// Segment file names, oldest first, with their frames.
    segments: Vec<(String, Vec<Frame>)>,
    /// Every message tag sent (all acknowledged with `201`).
    tags: BTreeSet<String>,
}

/// The frames of one segment file, read with the format's own header
/// parser; stops at the zero-filled rest of a preallocated file.
fn frames(bytes: &[u8]) -> Vec<Frame> {
    let mut out = Vec::new();
    let mut at = FILE_HEADER_BYTES;
    while at + FRAME_HEADER_BYTES <= bytes.len() {
        let header = FrameHeader::peek(&bytes[at..]);
        if header.body_len == 0 {
            break;
        }
        let len = FRAME_HEADER_BYTES + header.body_len as usize;
        out.push(Frame {
            offset: at,
            len,
            kind: header.kind,
        });
        at += len;
    }
    out
}

fn segment_names(spool: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(spool)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".seg"))
        .collect();
    names.sort();
    names
}

async fn template() -> Template {
    let dir = tempfile::tempdir().unwrap();
    let mut spoold = start_config(dir.path(), "", SPOOL_KEYS, TABLES).await;
    let mut tags = BTreeSet::new();
    let pad = "x".repeat(300);
    for i in 0..MESSAGES {
        let tag = format!("m{i:04}");
        let r = spoold.api().send("q", &format!("{tag} {pad}")).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        tags.insert(tag);
    }
    // The last record of the journal is a short message, so that tearing
    // it at every offset stays quick.
    let r = spoold.api().send("q", "last").await;
    assert_eq!(r.status(), StatusCode::CREATED);
    tags.insert("last".to_string());
    assert_eq!(spoold.stop(), 0, "a clean exit");

    let spool = dir.path().join("spool");
    let segments: Vec<(String, Vec<Frame>)> = segment_names(&spool)
        .into_iter()
        .map(|name| {
            let frames = frames(&std::fs::read(spool.join(&name)).unwrap());
            (name, frames)
        })
        .collect();
    assert!(segments.len() >= 4, "{} segments", segments.len());
    let last = segments.last().unwrap().1.last().unwrap();
    assert_eq!(last.kind, kind::ENQUEUE);
    Template {
        dir,
        segments,
        tags,
    }
}

impl Template {
    /// A fresh copy of the stopped spool, with its own config.
    fn copy(&self) -> tempfile::TempDir {
        let to = tempfile::tempdir().unwrap();
        common::copy_dir(&self.dir.path().join("spool"), &to.path().join("spool"));
        to
    }

    fn segment(&self, i: usize) -> (&str, &[Frame]) {
        let (name, frames) = &self.segments[i];
        (name, frames)
    }

    /// The tags of the messages whose enqueue records are in segment `i`.
    fn tags_in_segment(&self, i: usize) -> BTreeSet<String> {
        let (name, frames) = self.segment(i);
        let bytes = std::fs::read(self.dir.path().join("spool").join(name)).unwrap();
        frames
            .iter()
            .filter(|f| f.kind == kind::ENQUEUE)
            .map(|f| tag_of_frame(&bytes[f.offset..f.offset + f.len]))
            .collect()
    }
}

/// The tag of the message an enqueue frame carries: its payload is stored
/// verbatim, so the tag is the first word found in the frame.
fn tag_of_frame(frame: &[u8]) -> String {
    let text = String::from_utf8_lossy(frame);
    if text.contains("last") && !text.contains("xxx") {
        return "last".to_string();
    }
    let at = text.find(" xxx").expect("a message frame");
    text[at - 5..at].to_string()
}

fn spool_file(dir: &Path, name: &str) -> PathBuf {
    dir.join("spool").join(name)
}

fn edit(dir: &Path, name: &str, f: impl FnOnce(&mut Vec<u8>)) {
    let path = spool_file(dir, name);
    let mut bytes = std::fs::read(&path).unwrap();
    f(&mut bytes);
    std::fs::write(&path, &bytes).unwrap();
}

/// `spoold run` must refuse to start: exit 1 within 20 s; returns stderr.
fn run_refuses(dir: &Path) -> String {
    let config = write_config(dir, "", SPOOL_KEYS, TABLES);
    let ran = common::process::run_refuses(&config).expect("spoold started on a damaged spool");
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    ran.stderr
}

/// `spoold run` starts; returns the tags of every message in queue `q`.
async fn run_and_list(dir: &Path, spool_keys: &str) -> BTreeSet<String> {
    let spoold = start_config(dir, "", spool_keys, TABLES).await;
    messages_in(&client(), &spoold.base, "q")
        .await
        .iter()
        .map(|m| {
            let body = m["body"].as_str().unwrap();
            body.split(' ').next().unwrap().to_string()
        })
        .collect()
}

/// `spoold run` starts; returns the number of visible messages in `q`.
async fn run_and_count(dir: &Path) -> u64 {
    let spoold = start_config(dir, "", SPOOL_KEYS, TABLES).await;
    let queue = queue_json(&client(), &spoold.base, "q").await;
    queue["stats"]["visible"].as_u64().unwrap()
}

fn journal(dir: &Path, verb: &str) -> (i32, String) {
    let ran = common::process::run_in(dir, &["journal", verb, "--dir", "spool"]);
    (ran.code, format!("{}{}", ran.stdout, ran.stderr))
}

/// A refused spool: verify exits 1 naming `needle`; `on_corruption =
/// "quarantine"` starts with exactly `expected`; so does a second copy after
/// `journal repair`, which moves damaged bytes (if `bad_bytes`) to
/// quarantine files.
async fn refused_then_quarantined(
    template: &Template,
    damage: impl Fn(&Path),
    needle: &str,
    expected: &BTreeSet<String>,
    bad_bytes: bool,
) {
    let dir = template.copy();
    damage(dir.path());
    let stderr = run_refuses(dir.path());
    assert!(stderr.contains(needle), "run: {needle:?} not in {stderr}");
    let (code, out) = journal(dir.path(), "verify");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(needle), "verify: {needle:?} not in {out}");
    let kept = run_and_list(dir.path(), QUARANTINE_KEYS).await;
    assert_eq!(&kept, expected, "on_corruption = quarantine ({needle})");

    let dir = template.copy();
    damage(dir.path());
    let (code, out) = journal(dir.path(), "repair");
    assert_eq!(code, 0, "{out}");
    let quarantined = std::fs::read_dir(dir.path().join("spool"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().ends_with(".quarantine")
        })
        .count();
    assert_eq!(quarantined >= 1, bad_bytes, "quarantine files: {out}");
    let (code, out) = journal(dir.path(), "verify");
    assert_eq!(code, 0, "verify after repair: {out}");
    let kept = run_and_list(dir.path(), SPOOL_KEYS).await;
    assert_eq!(&kept, expected, "after journal repair ({needle})");
}

fn without(all: &BTreeSet<String>, gone: &BTreeSet<String>) -> BTreeSet<String> {
    all.difference(gone).cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_the_recovery_table_through_the_binary() {
    let started = Instant::now();
    let t = template().await;
    let all = t.tags.clone();
    let n_segments = t.segments.len();
    let mut rows = 0usize;

    // Row: the last record torn at every offset, as zeros inside the
    // preallocated file and as a file cut short. Truncated; the torn
    // message was never acknowledged; every other one is there.
    let (last_name, last_frames) = t.segment(n_segments - 1);
    let last = *last_frames.last().unwrap();
    for cut in 0..last.len {
        for zeroed in [true, false] {
            let dir = t.copy();
            edit(dir.path(), last_name, |b| {
                if zeroed {
                    b[last.offset + cut..last.offset + last.len].fill(0);
                } else {
                    b.truncate(last.offset + cut);
                }
            });
            let (code, out) = journal(dir.path(), "verify");
            assert_eq!(code, 0, "tear at {cut}: {out}");
            assert_eq!(
                run_and_count(dir.path()).await,
                MESSAGES as u64,
                "tear at {cut} (zeroed {zeroed})"
            );
            rows += 1;
        }
    }
    let tears = rows;

    // Rows: bit flips in earlier records (length, checksum, sequence, kind
    // and body bytes), in a sealed segment and in the last one. Refused
    // naming file and offset; quarantine keeps every other message.
    let mut flips = 0;
    for seg in [0, n_segments - 1] {
        let (name, frames) = t.segment(seg);
        let victim = frames[frames.len() / 2];
        assert_eq!(victim.kind, kind::ENQUEUE);
        let bytes = std::fs::read(spool_file(t.dir.path(), name)).unwrap();
        let victim_tag = tag_of_frame(&bytes[victim.offset..victim.offset + victim.len]);
        let expected = without(&all, &BTreeSet::from([victim_tag]));
        let needle = format!("{name} at offset {}", victim.offset);
        // Length, checksum, sequence and kind bytes, and the body's ends.
        for at in [1, 5, 9, 16, FRAME_HEADER_BYTES, victim.len - 1] {
            let damage = |dir: &Path| edit(dir, name, |b| b[victim.offset + at] ^= 0x10);
            refused_then_quarantined(&t, damage, &needle, &expected, true).await;
            flips += 1;
        }
    }
    rows += flips;

    // Row: the last record of a sealed segment damaged. Refused.
    {
        let (name, frames) = t.segment(1);
        let victim = *frames.last().unwrap();
        let bytes = std::fs::read(spool_file(t.dir.path(), name)).unwrap();
        let victim_tag = tag_of_frame(&bytes[victim.offset..victim.offset + victim.len]);
        let expected = without(&all, &BTreeSet::from([victim_tag]));
        let needle = format!("{name} at offset {}", victim.offset);
        let damage = |dir: &Path| edit(dir, name, |b| b[victim.offset + 30] ^= 0x01);
        refused_then_quarantined(&t, damage, &needle, &expected, true).await;
        rows += 1;
    }

    // Rows: bit flips in a sealed segment's header (magic, segment id,
    // checksum). Refused naming the file; quarantine keeps every message
    // of the other segments.
    let (name, _) = t.segment(1);
    let expected = without(&all, &t.tags_in_segment(1));
    for at in [0, 20, 62] {
        let damage = |dir: &Path| edit(dir, name, |b| b[at] ^= 0x04);
        refused_then_quarantined(&t, damage, name, &expected, true).await;
        rows += 1;
    }

    // Row: a sealed segment truncated in the middle of its records.
    // Refused, naming the file and the offset of the cut ("sealed segment
    // ends in damage"); quarantine keeps every record before the cut and
    // every later segment.
    {
        let (name, frames) = t.segment(1);
        let cut = frames[frames.len() / 2];
        let bytes = std::fs::read(spool_file(t.dir.path(), name)).unwrap();
        let gone: BTreeSet<String> = frames[frames.len() / 2..]
            .iter()
            .filter(|f| f.kind == kind::ENQUEUE)
            .map(|f| tag_of_frame(&bytes[f.offset..f.offset + f.len]))
            .collect();
        let expected = without(&all, &gone);
        let damage = |dir: &Path| edit(dir, name, |b| b.truncate(cut.offset + 7));
        let needle = format!("{name} at offset {}", cut.offset);
        refused_then_quarantined(&t, damage, &needle, &expected, true).await;
        rows += 1;
    }

    // Row: a missing middle segment. Refused; quarantine declares the gap
    // and keeps every other segment's messages.
    {
        let (name, _) = t.segment(1);
        let expected = without(&all, &t.tags_in_segment(1));
        let damage = |dir: &Path| std::fs::remove_file(spool_file(dir, name)).unwrap();
        refused_then_quarantined(&t, damage, "missing", &expected, false).await;
        rows += 1;
    }

    // Row: the last segment's header cut short (a rotation cut short, on a
    // spool whose last segment holds nothing yet): removed, starts.
    {
        let dir = t.copy();
        let last_id: u64 = last_name.trim_end_matches(".seg").parse().unwrap();
        let next = format!("{:016}.seg", last_id + 1);
        std::fs::write(spool_file(dir.path(), &next), [0x53u8; 30]).unwrap();
        let (code, out) = journal(dir.path(), "verify");
        assert_eq!(code, 0, "{out}");
        assert_eq!(run_and_list(dir.path(), SPOOL_KEYS).await, all);
        rows += 1;
    }

    // Row: leftover temp files of a compaction and of preallocation cut
    // short. Deleted; the old segments replay in full.
    {
        let dir = t.copy();
        let (name, _) = t.segment(2);
        let compact_tmp = format!("{name}.compact.tmp");
        std::fs::write(spool_file(dir.path(), &compact_tmp), vec![0xAB; 5000]).unwrap();
        std::fs::write(spool_file(dir.path(), "prealloc-99.tmp"), vec![0; 4096]).unwrap();
        let (code, out) = journal(dir.path(), "verify");
        assert_eq!(code, 0, "{out}");
        assert_eq!(run_and_list(dir.path(), SPOOL_KEYS).await, all);
        assert!(!spool_file(dir.path(), &compact_tmp).exists());
        assert!(!spool_file(dir.path(), "prealloc-99.tmp").exists());
        rows += 1;
    }

    rows += compacted_rows(&t).await;

    println!(
        "corruption matrix: {rows} cases ({tears} tears of the last record, {flips} record bit \
         flips, headers, truncation, a missing segment, temp files, a damaged checkpoint, a \
         damaged and a missing pack) over {n_segments} segments of {} messages in {:.1}s",
        all.len(),
        started.elapsed().as_secs_f64()
    );
}

/// The template compacted offline (every sealed segment's messages moved
/// into a pack, a checkpoint beside it), then five more messages sent, so
/// that records follow the checkpoint.
async fn compacted(t: &Template) -> Template {
    let dir = t.copy();
    let (code, out) = journal(dir.path(), "compact");
    assert_eq!(code, 0, "{out}");
    let mut spoold = start_config(dir.path(), "", SPOOL_KEYS, TABLES).await;
    let mut tags = t.tags.clone();
    for i in 0..5 {
        let tag = format!("after{i}");
        let r = spoold
            .api()
            .send("q", &format!("{tag} {}", "x".repeat(300)))
            .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        tags.insert(tag);
    }
    assert_eq!(spoold.stop(), 0, "a clean exit");
    Template {
        dir,
        segments: Vec::new(),
        tags,
    }
}

fn files_ending(dir: &Path, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("spool"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(suffix))
        .collect();
    names.sort();
    names
}

/// Rows of a compacted spool: a damaged checkpoint, a damaged pack record,
/// a missing pack. Refused naming the file; quarantine and repair keep
/// every message whose records are intact, and name each one they lose.
async fn compacted_rows(t: &Template) -> usize {
    let c = compacted(t).await;
    let all = c.tags.clone();
    let after: BTreeSet<String> = all
        .iter()
        .filter(|t| t.starts_with("after"))
        .cloned()
        .collect();
    let checkpoint = files_ending(c.dir.path(), ".ckpt")
        .pop()
        .expect("a checkpoint");
    let packs = files_ending(c.dir.path(), ".pack");
    assert!(!packs.is_empty(), "journal compact wrote a pack");
    let mut rows = 0;

    // A bit flipped in the checkpoint's message chunk: the state it held
    // is lost (its messages are named as lost); what came after it stays.
    let len = std::fs::metadata(spool_file(c.dir.path(), &checkpoint))
        .unwrap()
        .len() as usize;
    let damage = |dir: &Path| edit(dir, &checkpoint, |b| b[len - 200] ^= 0x08);
    refused_then_quarantined(&c, damage, &checkpoint, &after, true).await;
    rows += 1;

    // A bit flipped in a pack's record: that message is lost.
    let pack = &packs[0];
    let bytes = std::fs::read(spool_file(c.dir.path(), pack)).unwrap();
    let frames = frames(&bytes);
    let victim = frames[frames.len() / 2];
    let victim_tag = tag_of_frame(&bytes[victim.offset..victim.offset + victim.len]);
    let expected = without(&all, &BTreeSet::from([victim_tag]));
    let needle = format!("{pack} at offset {}", victim.offset);
    let damage = |dir: &Path| edit(dir, pack, |b| b[victim.offset + 40] ^= 0x02);
    refused_then_quarantined(&c, damage, &needle, &expected, true).await;
    rows += 1;

    // A missing pack: its messages are lost.
    let gone: BTreeSet<String> = frames
        .iter()
        .filter(|f| f.kind == kind::ENQUEUE)
        .map(|f| tag_of_frame(&bytes[f.offset..f.offset + f.len]))
        .collect();
    let expected = without(&all, &gone);
    let damage = |dir: &Path| std::fs::remove_file(spool_file(dir, pack)).unwrap();
    refused_then_quarantined(&c, damage, "missing", &expected, false).await;
    rows += 1;
    rows
}
