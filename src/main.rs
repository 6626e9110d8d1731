//! The `spoold` binary: the command line, and one function per command
//! (`spoold::cli::commands` does the work). What belongs to the process
//! itself stays here: the global allocator and the panic hook.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Parser, Subcommand};

use spoold::cli::commands::{self, on_server};
use spoold::cli::ops::{self, DeadLetterArgs, Target};
use spoold::cli::term::Terminal;

#[derive(Parser)]
#[command(
    name = "spoold",
    version,
    about = "A durable local spool for outbound work"
)]
struct Cli {
    /// The running server, for the operator commands.
    #[arg(
        long,
        global = true,
        env = "SPOOLD_URL",
        default_value = "http://127.0.0.1:8787"
    )]
    url: String,
    /// API key for the operator commands (never logged).
    #[arg(long, global = true, env = "SPOOLD_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Print what the server stored as it is: without it, control
    /// characters in bodies, answers and errors (ESC, BEL, CR …) are
    /// printed escaped, so that they cannot act on the terminal.
    #[arg(long, global = true)]
    raw: bool,
    /// Serving options when no command is given (`spoold --listen …`).
    #[command(flatten)]
    run: RunArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Args, Clone, Default)]
struct RunArgs {
    /// The config file (TOML); without one, the embedded defaults.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Listen on this address instead of the config's `server.listen`.
    #[arg(long, env = "SPOOLD_LISTEN", value_name = "ADDR")]
    listen: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve (the default command).
    Run(RunArgs),
    /// Validate a config file and print the effective config as TOML
    /// (defaults filled in, secrets hidden).
    CheckConfig {
        /// The config file to check.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Print the OpenAPI 3.1 document of the HTTP API (also served at
    /// /v1/openapi.json).
    Openapi,
    /// Offline journal tools (the spool must not be running).
    Journal {
        #[command(subcommand)]
        command: JournalCommand,
    },
    /// List queues with their stats (a page at a time).
    Queues {
        #[command(flatten)]
        filter: ops::QueueFilter,
        /// One JSON object per queue, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Without QUEUE, the same as `queues`; with it, that queue's state,
    /// stats and settings.
    Stats {
        queue: Option<String>,
        /// JSON: one object per queue, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Change a queue's settings, pause or resume it, or act on its
    /// circuit breaker.
    Queue {
        #[command(subcommand)]
        command: QueueCommand,
    },
    /// Follow new messages of a queue, like `tail -f`; ends when the server
    /// stops.
    Tail {
        /// The queue (a failure queue too: `hooks.failed`).
        queue: String,
        /// First print the N newest messages.
        #[arg(short = 'n', long = "lines", value_name = "N", default_value_t = 0)]
        lines: usize,
        /// Print the raw JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Send one message (the body from --data, else standard input).
    Send {
        /// The queue.
        queue: String,
        /// The body (else standard input).
        #[arg(long)]
        data: Option<String>,
        /// The body's content type.
        #[arg(long, default_value = "application/octet-stream")]
        content_type: String,
        /// Idempotency key (the queue needs a dedup window).
        #[arg(long)]
        key: Option<String>,
        /// Ordering key: on a queue with ordering = "per_key", messages
        /// with the same key go one at a time, in order.
        #[arg(long)]
        ordering_key: Option<String>,
    },
    /// A queue's delivery history (historyRetentionSeconds): list, show,
    /// resend.
    History {
        #[command(subcommand)]
        command: HistoryCommand,
    },
    /// A queue's delivery log: pending, retrying, failed and delivered
    /// messages together, newest first, with attempts and last status.
    Deliveries {
        queue: String,
        #[command(flatten)]
        filter: ops::HistoryArgs,
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
        /// One JSON object per delivery, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Events: publish one to every queue that subscribes to its type.
    Events {
        #[command(subcommand)]
        command: EventsCommand,
    },
    /// Dead letters: the failure queue of QUEUE (name either `hooks` or
    /// `hooks.failed`).
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// The customer portal: links for a tenant's customers.
    Portal {
        #[command(subcommand)]
        command: PortalCommand,
    },
    /// Replicated mode: the cluster as the replica at --url sees it.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
}

#[derive(Subcommand)]
enum HistoryCommand {
    /// Delivered messages of QUEUE, newest first.
    List {
        queue: String,
        #[command(flatten)]
        filter: ops::HistoryArgs,
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
        /// One JSON object per message, one per line.
        #[arg(long)]
        json: bool,
    },
    /// One delivered message: its attempts, what the destination answered,
    /// its body.
    Show {
        queue: String,
        id: String,
        /// The message as one JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Send a delivered message again (a new message, a new delivery id);
    /// prints the new id.
    Resend { queue: String, id: String },
}

#[derive(Subcommand)]
enum EventsCommand {
    /// Publish an event (the payload from --data, else standard input);
    /// prints its id, then each delivery as `QUEUE ID`.
    Send {
        /// The event type, e.g. invoice.paid.
        #[arg(value_name = "TYPE")]
        event_type: String,
        /// The event's tenant: queues with another tenant do not get it.
        #[arg(long)]
        tenant: Option<String>,
        /// The payload (else standard input).
        #[arg(long)]
        data: Option<String>,
        /// The payload's content type.
        #[arg(long, default_value = "application/json")]
        content_type: String,
        /// Idempotency key: a repeat within events.dedup_window publishes
        /// nothing and prints the first event.
        #[arg(long)]
        key: Option<String>,
        /// Ordering key: each delivery's, in its queue.
        #[arg(long)]
        ordering_key: Option<String>,
        /// Print the answer as one JSON line.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum PortalCommand {
    /// Print a link to the portal for one tenant (an operator's key; the
    /// server needs portal.secret).
    Link {
        /// The tenant whose endpoints the page shows.
        #[arg(long)]
        tenant: String,
        /// How long the link works (30m, 8h).
        #[arg(long, default_value = "1h", value_parser = spoold::config::parse_duration)]
        ttl: std::time::Duration,
        /// What the customer may do: read, manage, publish (repeat;
        /// default all three).
        #[arg(long = "capability", value_name = "CAPABILITY")]
        capabilities: Vec<String>,
        /// Keep the session to queues named so (`cus_42-*`; repeat).
        #[arg(long = "queue", value_name = "PATTERN")]
        queues: Vec<String>,
        /// Print the answer as one JSON line.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum QueueCommand {
    /// Change only the settings named, as KEY=VALUE (a JSON merge patch:
    /// `breakerFailures=1000`, `backoff.maxSeconds=60`,
    /// `headers.Authorization="Bearer …"`, `rateLimit=null` resets); the
    /// others keep their values.
    Set {
        queue: String,
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
        /// The queue as one JSON object.
        #[arg(long)]
        json: bool,
        /// A destination moved to another origin keeps the signing secret
        /// (its static headers never go with it); without it such a move
        /// is refused while a secret would be left behind.
        #[arg(long)]
        keep_secrets: bool,
    },
    /// Stop handing out leases (push delivery included).
    Pause { queue: String },
    /// Hand out leases again; an open circuit breaker is closed too.
    Resume { queue: String },
    /// Send the open circuit breaker's probe now.
    Probe { queue: String },
    /// Close the circuit breaker without a probe: delivery resumes.
    CloseBreaker { queue: String },
    /// Rotate a push queue's signing secret: prints the new one (shown
    /// this once); the old one signs beside it for the overlap.
    RotateSecret {
        queue: String,
        /// The new secret (whsec_ and base64); generated without it.
        #[arg(long)]
        secret: Option<String>,
        /// How long the old secret keeps signing (default 24h; 0s drops
        /// it at once).
        #[arg(long, value_parser = spoold::config::parse_duration)]
        overlap: Option<std::time::Duration>,
        /// The answer as one JSON line.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Role, term, primary and commit index, and every member with how far
    /// it lags.
    Status {
        /// The answer of `GET /v1/cluster` as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Adds replica ID, reachable for replication at ADDR (its
    /// cluster.advertise): a learner until it caught up, then a voter. Use
    /// an id the cluster never had.
    Add {
        id: u64,
        addr: String,
        /// How long the new member may take to catch up (default 5m).
        #[arg(long, value_parser = spoold::config::parse_duration)]
        wait: Option<std::time::Duration>,
        #[arg(long)]
        json: bool,
    },
    /// Removes replica ID; refused if the voters left would not hold a
    /// majority that answers the primary.
    Remove {
        id: u64,
        #[arg(long)]
        json: bool,
    },
    /// Offline: replaces the stored vote of a stopped replica with one for
    /// itself in TERM (a vote for a term no election reaches stops Raft;
    /// the replica's log says so). TERM must be above every term the
    /// cluster used.
    RepairVote {
        /// The replica's spool directory (spool.dir).
        #[arg(long)]
        dir: PathBuf,
        /// Above the `term` of `spoold cluster status` on a healthy replica.
        #[arg(long)]
        term: u64,
    },
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Dead letters with reason, last status, attempts and time.
    List {
        /// The queue, or its failure queue.
        queue: String,
        #[command(flatten)]
        filter: DeadLetterArgs,
        #[command(flatten)]
        search: ops::SearchArgs,
        /// Show at most N (oldest first).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// One JSON object per dead letter, one per line.
        #[arg(long)]
        json: bool,
    },
    /// One dead letter: every attempt, the destination's answers, the
    /// stored request and the body.
    Show {
        /// The queue, or its failure queue.
        queue: String,
        /// The message id.
        id: String,
        /// The message as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Move dead letters back into QUEUE (retry counts reset, same ids).
    Redrive {
        /// The queue, or its failure queue.
        queue: String,
        #[command(flatten)]
        filter: DeadLetterArgs,
        /// Move at most N (oldest first; the server's default is 1000);
        /// the answer says how many more match.
        #[arg(long, value_name = "N")]
        max: Option<u64>,
        /// Only count what would move; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// The server's answer as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Delete dead letters (all, or those the filters select); asks first
    /// unless --yes.
    Purge {
        /// The queue, or its failure queue.
        queue: String,
        #[command(flatten)]
        filter: DeadLetterArgs,
        /// Delete at most N (oldest first); the answer says how many more
        /// match.
        #[arg(long, value_name = "N")]
        max: Option<u64>,
        /// Only count what would go; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// The server's answer as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum JournalCommand {
    /// Report every damaged span; exit 1 if any.
    Verify {
        /// The spool directory (`spool.dir`).
        #[arg(long)]
        dir: PathBuf,
    },
    /// Move every damaged span to a quarantine file and keep every good
    /// record.
    Repair {
        /// The spool directory (`spool.dir`).
        #[arg(long)]
        dir: PathBuf,
    },
    /// Compact every file that holds garbage now.
    Compact {
        /// The spool directory (`spool.dir`).
        #[arg(long)]
        dir: PathBuf,
    },
    /// Convert a spool written by an older spoold (format 1) to this
    /// format; start-up does it too.
    Upgrade {
        /// The spool directory (`spool.dir`).
        #[arg(long)]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    crash_on_panic();
    let cli = Cli::parse();
    RAW.store(cli.raw, Ordering::Relaxed);
    let target = Target::new(&cli.url, cli.api_key.clone());
    let result = dispatch(cli.command.unwrap_or(Command::Run(cli.run)), &target);
    commands::exit_code(result, RAW.load(Ordering::Relaxed))
}

/// Calls the command's function; the operator commands call the server at
/// `target`.
fn dispatch(command: Command, target: &Target) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run(args) => commands::run(args.config, args.listen),
        Command::CheckConfig { config } => commands::check_config(&config, &mut stdout()),
        Command::Openapi => commands::openapi(&mut stdout()),
        Command::Journal { command } => journal(command),
        Command::Queues { filter, json } => {
            on_server(ops::queues(target, &filter, json, &mut stdout()))
        }
        Command::Stats { queue, json } => stats(target, queue, json),
        Command::Queue { command } => queue(target, command),
        Command::Tail { queue, lines, json } => {
            on_server(commands::tail(target, &queue, lines, json, &mut stdout()))
        }
        Command::Send {
            queue,
            data,
            content_type,
            key,
            ordering_key,
        } => on_server(commands::send(
            target,
            &queue,
            data,
            &content_type,
            ops::Keys {
                idempotency: key.as_deref(),
                ordering: ordering_key.as_deref(),
            },
            &mut stdout(),
        )),
        Command::History { command } => history(target, command),
        Command::Deliveries {
            queue,
            filter,
            limit,
            json,
        } => {
            let out = &mut stdout();
            on_server(ops::deliveries(target, &queue, &filter, limit, json, out))
        }
        Command::Events { command } => events(target, command),
        Command::Dlq { command } => dlq(target, command),
        Command::Cluster { command } => cluster(target, command),
        Command::Portal { command } => portal(target, command),
    }
}

/// `spoold stats [QUEUE]`: without a queue the same as `spoold queues`;
/// with one, that queue's state, stats and settings.
fn stats(target: &Target, queue: Option<String>, json: bool) -> anyhow::Result<ExitCode> {
    match queue {
        None => {
            let every = ops::QueueFilter::default();
            on_server(ops::queues(target, &every, json, &mut stdout()))
        }
        Some(queue) => on_server(ops::queue_stats(target, &queue, json, &mut stdout())),
    }
}

/// `spoold portal link`: a link to the portal for one tenant's customers.
fn portal(target: &Target, command: PortalCommand) -> anyhow::Result<ExitCode> {
    let PortalCommand::Link {
        tenant,
        ttl,
        capabilities,
        queues,
        json,
    } = command;
    let link = ops::PortalLink {
        tenant: &tenant,
        ttl_seconds: ttl.as_secs(),
        capabilities: &capabilities,
        queues: &queues,
    };
    on_server(ops::portal_link(target, link, json, &mut stdout()))
}

/// `spoold journal …`: offline, on a stopped spool (each tool takes its
/// lock); no server is called.
fn journal(command: JournalCommand) -> anyhow::Result<ExitCode> {
    let out = &mut stdout();
    match command {
        JournalCommand::Verify { dir } => commands::verify_journal(&dir, out),
        JournalCommand::Repair { dir } => commands::repair_journal(&dir, out),
        JournalCommand::Compact { dir } => commands::compact_journal(&dir, out),
        JournalCommand::Upgrade { dir } => commands::upgrade_journal(&dir, out),
    }
}

/// `spoold queue …`: `set` sends a merge patch of the settings named; the
/// others are one action each on the queue.
fn queue(target: &Target, command: QueueCommand) -> anyhow::Result<ExitCode> {
    let out = &mut stdout();
    let (queue, action) = match command {
        QueueCommand::Set {
            queue,
            settings,
            json,
            keep_secrets,
        } => {
            let set = ops::queue_set(target, &queue, &settings, (json, keep_secrets), out);
            return on_server(set);
        }
        QueueCommand::Pause { queue } => (queue, ops::QueueAction::Pause),
        QueueCommand::Resume { queue } => (queue, ops::QueueAction::Resume),
        QueueCommand::Probe { queue } => (queue, ops::QueueAction::Probe),
        QueueCommand::CloseBreaker { queue } => (queue, ops::QueueAction::CloseBreaker),
        QueueCommand::RotateSecret {
            queue,
            secret,
            overlap,
            json,
        } => {
            let asked = (secret.as_deref(), overlap.map(|d| d.as_secs_f64()));
            let rotate = ops::rotate_secret(target, &queue, asked, json, out);
            return on_server(rotate);
        }
    };
    on_server(ops::queue_action(target, &queue, action, out))
}

/// `spoold history …`: a queue's delivered messages.
fn history(target: &Target, command: HistoryCommand) -> anyhow::Result<ExitCode> {
    let out = &mut stdout();
    match command {
        HistoryCommand::List {
            queue,
            filter,
            limit,
            json,
        } => on_server(ops::history_list(target, &queue, &filter, limit, json, out)),
        HistoryCommand::Show { queue, id, json } => {
            on_server(ops::history_show(target, &queue, &id, json, out))
        }
        HistoryCommand::Resend { queue, id } => {
            on_server(ops::history_resend(target, &queue, &id, out))
        }
    }
}

/// `spoold events send`: the payload is read (from standard input without
/// `--data`) on the command's runtime, as the message body of `send` is.
fn events(target: &Target, command: EventsCommand) -> anyhow::Result<ExitCode> {
    let EventsCommand::Send {
        event_type,
        tenant,
        data,
        content_type,
        key,
        ordering_key,
        json,
    } = command;
    on_server(async {
        let event = ops::Event {
            event_type: &event_type,
            tenant: tenant.as_deref(),
            payload: commands::body(data)?,
            content_type: &content_type,
            keys: ops::Keys {
                idempotency: key.as_deref(),
                ordering: ordering_key.as_deref(),
            },
        };
        ops::events_send(target, event, json, &mut stdout()).await
    })
}

/// `spoold dlq …`: a purge asks on standard error and reads the answer from
/// standard input, so that its listing on standard output stays clean.
fn dlq(target: &Target, command: DlqCommand) -> anyhow::Result<ExitCode> {
    let out = &mut stdout();
    match command {
        DlqCommand::List {
            queue,
            filter,
            search,
            limit,
            json,
        } => on_server(ops::dlq_list(
            target, &queue, &filter, &search, limit, json, out,
        )),
        DlqCommand::Show { queue, id, json } => {
            on_server(ops::dlq_show(target, &queue, &id, json, out))
        }
        DlqCommand::Redrive {
            queue,
            filter,
            max,
            dry_run,
            json,
        } => on_server(ops::dlq_redrive(
            target, &queue, &filter, max, dry_run, json, out,
        )),
        DlqCommand::Purge {
            queue,
            filter,
            max,
            dry_run,
            yes,
            json,
        } => on_server(ops::dlq_purge(
            target,
            &queue,
            &filter,
            ops::Bulk { max, dry_run, yes },
            json,
            &mut std::io::stdin().lock(),
            &mut std::io::stderr(),
            out,
        )),
    }
}

/// `spoold cluster …`: over the API of the replica at `--url`, but
/// `repair-vote`, which works offline on a stopped replica's spool.
fn cluster(target: &Target, command: ClusterCommand) -> anyhow::Result<ExitCode> {
    let out = &mut stdout();
    match command {
        ClusterCommand::Status { json } => on_server(ops::cluster_status(target, json, out)),
        ClusterCommand::Add {
            id,
            addr,
            wait,
            json,
        } => on_server(ops::cluster_add(target, (id, &addr), wait, json, out)),
        ClusterCommand::Remove { id, json } => {
            on_server(ops::cluster_remove(target, id, json, out))
        }
        ClusterCommand::RepairVote { dir, term } => commands::repair_vote(&dir, term, out),
    }
}

/// `--raw`: print stored bytes as they are.
static RAW: AtomicBool = AtomicBool::new(false);

/// Standard output, control characters escaped unless `--raw`
/// (`cli/term.rs`).
fn stdout() -> Terminal<std::io::StdoutLock<'static>> {
    Terminal::new(std::io::stdout().lock(), RAW.load(Ordering::Relaxed))
}

/// A panic anywhere — a request handler, a background task, the journal's
/// threads — is a bug, and a half-working server is worse than none: log
/// it and abort, so the supervisor restarts the process and replay decides
/// (TigerBeetle's rule). Release builds also set `panic = "abort"`; this
/// covers debug builds and says why in the log.
fn crash_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        tracing::error!(panic = %info, "a bug: aborting (the supervisor restarts spoold; replay decides)");
        std::process::abort();
    }));
}

/// The allocator is chosen when the binary is built: jemalloc (the default
/// feature), mimalloc (feature `mimalloc`), or the system's
/// (`--no-default-features`); `docs/performance.md` has the comparison that
/// chose jemalloc. Its settings, if any, come from how the binary is
/// deployed; both are logged at start-up (`spoold::cli::commands::run`).
#[cfg(all(feature = "mimalloc", not(feature = "count-allocations")))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(all(
    feature = "jemalloc",
    not(feature = "mimalloc"),
    not(feature = "count-allocations")
))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Feature `count-allocations` (benchmarks only): jemalloc, each
/// allocation counted (`spoold::allocations`).
#[cfg(feature = "count-allocations")]
#[global_allocator]
static ALLOCATOR: spoold::allocations::Counting<tikv_jemallocator::Jemalloc> =
    spoold::allocations::Counting(tikv_jemallocator::Jemalloc);
