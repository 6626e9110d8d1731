//! The `spoold` binary: parse the command line, load the config, set up
//! logging, and hand over to the library.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use spoold::cli::ops::{self, DeadLetterArgs};
use spoold::cli::term::Terminal;
use spoold::config::{Config, LogFormat};
use spoold::serve::Outcome;

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
    /// List queues with their stats.
    Queues {
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
    },
    /// A queue's delivery history (historyRetentionSeconds): list, show,
    /// resend.
    History {
        #[command(subcommand)]
        command: HistoryCommand,
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
    },
    /// Stop handing out leases (push delivery included).
    Pause { queue: String },
    /// Hand out leases again; an open circuit breaker is closed too.
    Resume { queue: String },
    /// Send the open circuit breaker's probe now.
    Probe { queue: String },
    /// Close the circuit breaker without a probe: delivery resumes.
    CloseBreaker { queue: String },
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
    RAW.store(cli.raw, std::sync::atomic::Ordering::Relaxed);
    let target = ops::Target::new(&cli.url, cli.api_key.clone());
    let result = match cli.command.unwrap_or(Command::Run(cli.run)) {
        Command::Queues { json } | Command::Stats { queue: None, json } => {
            ops(ops::queues(&target, json, &mut stdout()))
        }
        Command::Stats {
            queue: Some(queue),
            json,
        } => ops(ops::queue_stats(&target, &queue, json, &mut stdout())),
        Command::Queue { command } => {
            let target = &target;
            let action = |queue: String, action| {
                ops(async move { ops::queue_action(target, &queue, action, &mut stdout()).await })
            };
            match command {
                QueueCommand::Set {
                    queue,
                    settings,
                    json,
                } => ops(ops::queue_set(
                    target,
                    &queue,
                    &settings,
                    json,
                    &mut stdout(),
                )),
                QueueCommand::Pause { queue } => action(queue, ops::QueueAction::Pause),
                QueueCommand::Resume { queue } => action(queue, ops::QueueAction::Resume),
                QueueCommand::Probe { queue } => action(queue, ops::QueueAction::Probe),
                QueueCommand::CloseBreaker { queue } => {
                    action(queue, ops::QueueAction::CloseBreaker)
                }
            }
        }
        Command::Tail { queue, lines, json } => ops(async {
            let ops::TailEnd::ServerStopped =
                ops::tail(&target, &queue, lines, json, &mut stdout()).await?;
            eprintln!("spoold: the server stopped; tail ends");
            Ok(())
        }),
        Command::Send {
            queue,
            data,
            content_type,
            key,
        } => ops(async {
            let body = match data {
                Some(d) => d.into_bytes(),
                None => {
                    let mut buf = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)?;
                    buf
                }
            };
            let id = ops::send(&target, &queue, body, &content_type, key.as_deref()).await?;
            writeln!(stdout(), "{id}")?;
            Ok(())
        }),
        Command::History { command } => match command {
            HistoryCommand::List {
                queue,
                filter,
                limit,
                json,
            } => ops(ops::history_list(
                &target,
                &queue,
                &filter,
                limit,
                json,
                &mut stdout(),
            )),
            HistoryCommand::Show { queue, id, json } => {
                ops(ops::history_show(&target, &queue, &id, json, &mut stdout()))
            }
            HistoryCommand::Resend { queue, id } => {
                ops(ops::history_resend(&target, &queue, &id, &mut stdout()))
            }
        },
        Command::Events {
            command:
                EventsCommand::Send {
                    event_type,
                    tenant,
                    data,
                    content_type,
                    key,
                    json,
                },
        } => ops(async {
            let payload = match data {
                Some(d) => d.into_bytes(),
                None => {
                    let mut buf = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)?;
                    buf
                }
            };
            let event = ops::Event {
                event_type: &event_type,
                tenant: tenant.as_deref(),
                payload,
                content_type: &content_type,
                key: key.as_deref(),
            };
            ops::events_send(&target, event, json, &mut stdout()).await
        }),
        Command::Dlq { command } => match command {
            DlqCommand::List {
                queue,
                filter,
                search,
                limit,
                json,
            } => ops(ops::dlq_list(
                &target,
                &queue,
                &filter,
                &search,
                limit,
                json,
                &mut stdout(),
            )),
            DlqCommand::Show { queue, id, json } => {
                ops(ops::dlq_show(&target, &queue, &id, json, &mut stdout()))
            }
            DlqCommand::Redrive {
                queue,
                filter,
                max,
                dry_run,
                json,
            } => ops(ops::dlq_redrive(
                &target,
                &queue,
                &filter,
                max,
                dry_run,
                json,
                &mut stdout(),
            )),
            DlqCommand::Purge {
                queue,
                filter,
                max,
                dry_run,
                yes,
                json,
            } => ops(ops::dlq_purge(
                &target,
                &queue,
                &filter,
                ops::Bulk { max, dry_run, yes },
                json,
                &mut std::io::stdin().lock(),
                &mut std::io::stderr(),
                &mut stdout(),
            )),
        },
        Command::Cluster { command } => match command {
            ClusterCommand::Status { json } => {
                ops(ops::cluster_status(&target, json, &mut stdout()))
            }
            ClusterCommand::Add {
                id,
                addr,
                wait,
                json,
            } => ops(ops::cluster_add(
                &target,
                (id, &addr),
                wait,
                json,
                &mut stdout(),
            )),
            ClusterCommand::Remove { id, json } => {
                ops(ops::cluster_remove(&target, id, json, &mut stdout()))
            }
            ClusterCommand::RepairVote { dir, term } => {
                spoold::cli::journal::repair_vote(&dir, term)
                    .map_err(anyhow::Error::from)
                    .and_then(|said| print_out(&said))
                    .map(|()| ExitCode::SUCCESS)
            }
        },
        Command::Run(args) => run(args),
        Command::CheckConfig { config } => check_config(config),
        Command::Openapi => {
            print_out(&(spoold::openapi_document() + "\n")).map(|()| ExitCode::SUCCESS)
        }
        Command::Journal { command } => match command {
            JournalCommand::Verify { dir } => verify(dir),
            JournalCommand::Repair { dir } => repair(dir),
            JournalCommand::Compact { dir } => compact(dir),
            JournalCommand::Upgrade { dir } => upgrade(dir),
        },
    };
    match result {
        Ok(code) => code,
        // The reader of our output went away (`spoold dlq list q | head`):
        // nothing is wrong and nobody is left to tell.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let text = format!("{e:#}");
            let raw = RAW.load(std::sync::atomic::Ordering::Relaxed);
            let text = if raw {
                text.into()
            } else {
                spoold::cli::term::escape_controls(&text)
            };
            eprintln!("spoold: {text}");
            match e.downcast_ref::<ops::OpsError>() {
                Some(ops::OpsError::Usage(_)) => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

/// `--raw`: print stored bytes as they are.
static RAW: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Standard output, control characters escaped unless `--raw`
/// (`cli/term.rs`).
fn stdout() -> Terminal<std::io::StdoutLock<'static>> {
    Terminal::new(
        std::io::stdout().lock(),
        RAW.load(std::sync::atomic::Ordering::Relaxed),
    )
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        let io = cause.downcast_ref::<std::io::Error>().or_else(|| {
            match cause.downcast_ref::<ops::OpsError>() {
                Some(ops::OpsError::Io(io)) => Some(io),
                _ => None,
            }
        });
        io.is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Prints `text` to standard output (a closed pipe surfaces as an error
/// that `main` treats as a quiet end).
fn print_out(text: &str) -> anyhow::Result<()> {
    let mut out = stdout();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Runs an operator command on a small runtime.
fn ops(
    command: impl std::future::Future<Output = Result<(), ops::OpsError>>,
) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(command)?;
    Ok(ExitCode::SUCCESS)
}

fn load_config(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Ok(Config::load(p)?),
        None => Ok(Config::default()),
    }
}

/// Logs to stderr (text or JSON), and, with `[telemetry] otlp_endpoint`,
/// spans to an OTLP collector (`src/telemetry.rs`): the returned handle
/// sends the last ones at exit.
fn init_tracing(config: &Config) -> anyhow::Result<Option<spoold::telemetry::Telemetry>> {
    use tracing_subscriber::prelude::*;
    // openraft logs every election step at `info`, each a page long; keep
    // it to warnings unless the filter names it.
    let spec = std::env::var("SPOOLD_LOG")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| config.log.level.clone());
    let spec = if spec.contains("openraft") {
        spec
    } else {
        format!("{spec},openraft=warn")
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&spec)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log.level));
    // Colour only for a person at a terminal: not in files or journald.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let fmt = match config.log.format {
        LogFormat::Json => fmt.json().boxed(),
        LogFormat::Text => fmt.boxed(),
    };
    let (telemetry, tracer) =
        match spoold::telemetry::Telemetry::start(&config.telemetry).map_err(anyhow::Error::msg)? {
            Some((telemetry, tracer)) => (Some(telemetry), Some(tracer)),
            None => (None, None),
        };
    tracing_subscriber::registry()
        .with(fmt)
        .with(filter)
        .with(tracer.map(|t| tracing_opentelemetry::layer().with_tracer(t)))
        .init();
    Ok(telemetry)
}

/// The same checks `run` makes before it serves: the file, then the
/// exposure (a key when listening beyond loopback, `SPOOLD_API_KEYS`
/// included).
fn check_config(path: PathBuf) -> anyhow::Result<ExitCode> {
    let config = load_config(Some(&path))?;
    config
        .check_exposure(std::env::var("SPOOLD_API_KEYS").ok().as_deref())
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    // What `run` asks before it serves: a replica needs its secret.
    if let Some(cluster) = &config.cluster {
        cluster
            .secret(std::env::var("SPOOLD_CLUSTER_SECRET").ok().as_deref())
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    print_out(&config.effective_toml())?;
    Ok(ExitCode::SUCCESS)
}

fn verify(dir: PathBuf) -> anyhow::Result<ExitCode> {
    let report = spoold::cli::journal::verify(&dir)?;
    print_out(&report.render(&dir))?;
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn repair(dir: PathBuf) -> anyhow::Result<ExitCode> {
    let report = spoold::cli::journal::repair(&dir)?;
    print_out(&report.render(&dir))?;
    Ok(ExitCode::SUCCESS)
}

fn upgrade(dir: PathBuf) -> anyhow::Result<ExitCode> {
    let report = spoold::cli::journal::upgrade(&dir)?;
    print_out(&report.render(&dir))?;
    Ok(ExitCode::SUCCESS)
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

fn compact(dir: PathBuf) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let text = runtime.block_on(spoold::cli::journal::compact(&dir))?;
    print_out(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let config = run_config(&args)?;
    let telemetry = init_tracing(&config)?;
    log_allocator();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(serve(config, args));
    drop(runtime);
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    served
}

/// The config `run` serves: the file (or the defaults), `--listen` over it.
fn run_config(args: &RunArgs) -> anyhow::Result<Config> {
    let mut config = load_config(args.config.as_ref())?;
    if let Some(listen) = &args.listen {
        config.server.listen.clone_from(listen);
        config.listen_line = None;
    }
    Ok(config)
}

/// The allocator is chosen when the binary is built: jemalloc (the default
/// feature), mimalloc (feature `mimalloc`), or the system's
/// (`--no-default-features`); `docs/performance.md` has the comparison that
/// chose jemalloc. Its settings, if any, come from how the binary is
/// deployed; both are logged at start-up.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn log_allocator() {
    // Each allocator reads its settings from the environment, once, at
    // start-up (tikv-jemallocator's jemalloc has prefixed symbols).
    let prefix = match spoold::ALLOCATOR {
        "mimalloc" => "MIMALLOC_",
        "jemalloc" => "_RJEM_MALLOC_CONF",
        _ => "GLIBC_TUNABLES",
    };
    let settings: Vec<String> = std::env::vars()
        .filter(|(name, _)| name.starts_with(prefix))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    let settings = if settings.is_empty() {
        format!("defaults (no {prefix}* set)")
    } else {
        settings.join(" ")
    };
    tracing::info!(allocator = spoold::ALLOCATOR, %settings, "allocator");
}

async fn serve(config: Config, args: RunArgs) -> anyhow::Result<ExitCode> {
    let running = spoold::serve::start(config, std::env::var("SPOOLD_API_KEYS").ok()).await?;
    let reloader = tokio::spawn(reload_on_hangup(running.reloader(), args));
    let stopper = tokio::spawn({
        let stop = running.stop_handle();
        async move {
            wait_for_signal().await;
            tracing::info!("signal received");
            stop.send_replace(true);
        }
    });
    let outcome = running.wait().await?;
    stopper.abort();
    reloader.abort();
    Ok(match outcome {
        Outcome::Stopped => ExitCode::SUCCESS,
        Outcome::Poisoned => ExitCode::from(1),
    })
}

/// SIGHUP: reads the config file again and hands it to the server, which
/// applies its queues and API keys or refuses it (a file that does not
/// parse is refused here); either way the log says what happened. This is
/// how a Kubernetes ConfigMap update reaches a running spoold.
async fn reload_on_hangup(reloader: spoold::serve::Reloader, args: RunArgs) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP: the config is read only at start");
        return;
    };
    while hangups.recv().await.is_some() {
        let Some(path) = &args.config else {
            tracing::warn!("SIGHUP: no --config file to read again; nothing changed");
            continue;
        };
        let config = match run_config(&args) {
            Ok(config) => config,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "SIGHUP: config refused; nothing changed");
                continue;
            }
        };
        match reloader
            .reload(config, std::env::var("SPOOLD_API_KEYS").ok())
            .await
        {
            Ok(done) => tracing::info!(
                config = %path.display(),
                queues = done.queues,
                api_keys = done.api_keys,
                restart_needed = %done.restart_needed.join(","),
                "SIGHUP: config reloaded"
            ),
            Err(e) => tracing::error!(error = %e, config = %path.display(),
                "SIGHUP: config refused; nothing changed"),
        }
    }
}

/// SIGTERM (what Kubernetes sends) or SIGINT (Ctrl-C).
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
