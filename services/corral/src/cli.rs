//! The `corral` command line: one clap definition of every subcommand and every flag.
//!
//! The binary parses with it before it reads the environment, creates a file or starts anything,
//! so `--help` and `--version` answer everywhere and a bad argument is refused (exit 2, with the
//! parser's suggestion) first. The jail's, the worker's and `egress decide`'s own arguments are
//! defined beside their code ([`corral_worker::cli::JailCommand`],
//! [`corral_worker::serve::WorkerCommand`], [`corral_egress_proxy::decide_cli::DecideArgs`]) and
//! embedded here. README.md's usage lines are rendered from this definition; a test keeps them
//! equal (`tests/cli.rs`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use corral_controller::network_policy::Reach;
use corral_egress_proxy::decide_cli::{self, DecideArgs};
use corral_worker::cli::JailCommand;
use corral_worker::serve::WorkerCommand;

/// `corral`: one binary, one subcommand per service or operator tool.
#[derive(Parser)]
// A flag given twice takes its last value, as the hand-written parsers did.
#[command(
    name = "corral",
    version,
    propagate_version = true,
    arg_required_else_help = true,
    args_override_self = true
)]
#[command(about = "Corral: a self-hosted code sandbox; one subcommand per service or tool")]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Every subcommand.
#[derive(Subcommand)]
pub enum Command {
    /// The embedded default: Valkey, API, controller, warm pool and egress proxy on this machine
    ///
    /// Valkey is started unless --valkey or CORRAL_VALKEY_URL names one; a field key is generated
    /// into the state directory unless SANDBOX_FIELD_KEY[_FILE] gives one. It prints one ready
    /// line with the API's URL and where the caller credential is stored, and serves until
    /// SIGINT or SIGTERM, when it stops everything it started.
    Up(UpArgs),
    /// Run one file through the API and print the result
    ///
    /// Exits 0 when the code ran and succeeded, 1 when it ran and failed (or hit a bound), 3
    /// when it was refused or not run, 2 for unusable arguments. The API is CORRAL_API_URL
    /// (default http://127.0.0.1:8000); the credential is CORRAL_API_TOKEN, else the file
    /// CORRAL_API_TOKEN_FILE, else .corral/api-token as `corral up` writes it.
    Run(RunArgs),
    /// An MCP server over stdio for an agent tool, acting through the API
    ///
    /// Its tools run code, read, list, write and edit the workspace, and drive browser sessions,
    /// for the one actor, conversation and member it is given (flags, or CORRAL_MCP_ACTOR,
    /// CORRAL_MCP_CONVERSATION, CORRAL_MCP_MEMBER); a tool argument never sets them. The API and
    /// its credential are found as `corral run` finds them.
    Mcp(McpArgs),
    /// The API service (settings from the environment)
    ///
    /// CORRAL_VALKEY_URL (required), CORRAL_POOL (default `default`), CORRAL_API_LISTEN (default
    /// 127.0.0.1:8000), CORRAL_WORKSPACE_URL (file:///dir, default
    /// file:///var/lib/corral/workspaces, or s3://bucket[/prefix] with the AWS_* variables),
    /// exactly one of CORRAL_WORKER_STATE_DIR and CORRAL_WORKER_URL_TEMPLATE, and the credentials
    /// CORRAL_API_TOKEN[_FILE], CORRAL_ADMIN_TOKEN[_FILE], CORRAL_WORKER_TOKEN[_FILE]; the
    /// SANDBOX_* settings as `corral config docs` lists them.
    Api,
    /// Keep the warm pool: local worker processes, pods, or claimed sandboxes
    ///
    /// Pool settings come from the environment (`corral config check` shows them). It runs until
    /// SIGINT or SIGTERM.
    Controller(ControllerArgs),
    /// A worker: its control API, which the controller and the API call
    #[command(subcommand)]
    Worker(WorkerCommand),
    /// Run the egress proxy (settings from the environment)
    ///
    /// CORRAL_EGRESS_LISTEN (default 127.0.0.1:3128), CORRAL_EGRESS_VERIFYING_KEY_FILE or
    /// CORRAL_EGRESS_VERIFYING_KEY_URL, SANDBOX_EGRESS_DNS_SERVERS and the CORRAL_EGRESS_* bounds
    /// (see corral-egress-proxy's crate docs). It serves until SIGINT or SIGTERM.
    EgressProxy,
    /// Operator tools for egress
    #[command(subcommand)]
    Egress(EgressCommand),
    /// Run one file in a fresh jail, or probe this machine's isolation
    #[command(subcommand)]
    Jail(JailCommand),
    /// Administer the embedded resource authority that `corral up` uses (one JSON line each)
    Resources(ResourcesArgs),
    /// Check the settings in the environment, or print their table
    #[command(subcommand)]
    Config(ConfigCommand),
}

/// `corral config`.
#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Parse every setting from the environment and print the result, or the error
    Check,
    /// Print the table of every setting (name, default, requirement, meaning) in Markdown
    Docs,
}

/// `corral egress`.
#[derive(Subcommand)]
pub enum EgressCommand {
    #[command(about = decide_cli::ABOUT, long_about = decide_cli::LONG_ABOUT)]
    Decide(DecideArgs),
}

/// `corral up`.
#[derive(Args)]
pub struct UpArgs {
    /// Credentials, worker records, workspaces and logs
    #[arg(long, value_name = "DIR", default_value = ".corral")]
    pub state_dir: PathBuf,
    /// The API's address (port 0 picks a free one)
    #[arg(long, value_name = "ADDR", default_value_t = corral_api::DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Use this Valkey instead of starting one (also CORRAL_VALKEY_URL)
    #[arg(long, value_name = "URL")]
    pub valkey: Option<String>,
    /// Once ready, run a sample run_code and print its result
    #[arg(long)]
    pub sample: bool,
    /// Mint no grants: every run proceeds with the network denied (EGR-8)
    #[arg(long)]
    pub no_field_key: bool,
    /// Serve this many API replicas, each on its own port after --listen's, all deciding
    /// through the one Valkey (a streamed run resumes on any of them)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
    pub api_replicas: u16,
}

/// `corral mcp`.
#[derive(Args)]
pub struct McpArgs {
    /// The actor the tools act for (default: CORRAL_MCP_ACTOR)
    #[arg(long, value_name = "A")]
    pub actor: Option<String>,
    /// The conversation whose workspace the tools use (default: CORRAL_MCP_CONVERSATION)
    #[arg(long, value_name = "C")]
    pub conversation: Option<String>,
    /// The member who asks (default: CORRAL_MCP_MEMBER, else the actor)
    #[arg(long, value_name = "M")]
    pub member: Option<String>,
}

/// `corral run`.
#[derive(Args)]
pub struct RunArgs {
    /// The file to run
    pub file: PathBuf,
    /// python or node (default: from FILE's extension)
    #[arg(long, value_name = "LANGUAGE")]
    pub language: Option<String>,
    /// The actor whose workspace the run uses
    #[arg(long, value_name = "A", default_value = "cli")]
    pub actor: String,
    /// The conversation whose workspace the run uses
    #[arg(long, value_name = "C", default_value = "cli")]
    pub conversation: String,
    /// The member who asked (default: the actor)
    #[arg(long, value_name = "M")]
    pub member: Option<String>,
    /// Print the API's JSON answer instead of the text for a person
    #[arg(long)]
    pub json: bool,
}

/// How the kube backend makes each worker's pod (`corral controller` and `corral controller
/// worker-pod`).
#[derive(Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerPodOptions {
    /// The pods' RuntimeClass, such as gvisor (kube)
    #[arg(long, value_name = "NAME")]
    pub runtime_class: Option<String>,
    /// The Secret with the workers' credential, key worker-token (kube; default
    /// corral-worker-credential)
    #[arg(long, value_name = "NAME")]
    pub credential_secret: Option<String>,
    /// The worker container's CPU, REQUEST:LIMIT or one quantity for both (kube; default 500m:2)
    #[arg(long, value_name = "QUANTITY")]
    pub worker_cpu: Option<String>,
    /// The worker container's memory, REQUEST:LIMIT or one quantity for both (kube; default
    /// 1Gi:3Gi)
    #[arg(long, value_name = "QUANTITY")]
    pub worker_memory: Option<String>,
}

/// `corral controller`: reconcile (the flags), or one of its subcommands.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ControllerArgs {
    /// A tool instead of the reconciler.
    #[command(subcommand)]
    pub command: Option<ControllerCommand>,
    /// The reconciler's flags.
    #[command(flatten)]
    pub reconcile: ReconcileArgs,
}

/// The workers' Kubernetes namespace: the controller's (kube and agent-sandbox) and
/// `network-policy`'s.
#[derive(Args)]
pub struct WorkersNamespace {
    /// The Kubernetes namespace of the workers (kube and agent-sandbox; nothing else runs there)
    #[arg(long, value_name = "NS", default_value = "corral")]
    pub namespace: String,
}

/// What `corral controller` reconciles with.
#[derive(Args)]
pub struct ReconcileArgs {
    /// The Valkey that holds the pool (required: the dynamic controller mode needs it, POOL-11)
    #[arg(long, value_name = "URL", required = true)]
    pub valkey: Option<String>,
    /// The pool's name
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub pool: String,
    /// The workers' namespace.
    #[command(flatten)]
    pub workers: WorkersNamespace,
    /// How often to reconcile, in milliseconds (kept within 50..=60000)
    #[arg(long, value_name = "N", default_value_t = 500)]
    pub period_ms: u64,
    /// Where workers come from
    #[arg(long, value_enum, default_value_t = BackendKind::Local)]
    pub backend: BackendKind,
    /// The local workers' records (and the generated workers' credential)
    #[arg(long, value_name = "DIR", default_value = "/var/lib/corral/workers")]
    pub state_dir: PathBuf,
    /// The worker image, by digest, with `corral` on its PATH (kube)
    #[arg(long, value_name = "REF", required_if_eq("backend", "kube"))]
    pub image: Option<String>,
    /// How the kube backend's worker pods are made.
    #[command(flatten)]
    pub pod: WorkerPodOptions,
    /// The SandboxTemplate that claims name (agent-sandbox)
    #[arg(long, value_name = "NAME", required_if_eq("backend", "agent-sandbox"))]
    pub sandbox_template: Option<String>,
    /// The SandboxWarmPool that claims name (agent-sandbox)
    #[arg(long, value_name = "NAME")]
    pub warm_pool: Option<String>,
    /// How workers are reached, http://HOST:PORT with {id} (required for agent-sandbox; kube's
    /// default is each worker's Service, http://{id}.NS.svc:8091)
    #[arg(long, value_name = "URL", required_if_eq("backend", "agent-sandbox"))]
    pub worker_url_template: Option<String>,
    /// Serve GET /healthz (200 while it runs) and /readyz (200 once a pass reached the store,
    /// 503 before and while the last one did not) on this address (default: not served)
    #[arg(long, value_name = "ADDR")]
    pub health_listen: Option<SocketAddr>,
}

/// `corral controller --backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Worker processes on this machine, each `corral worker serve`
    Local,
    /// One pod and one Service per worker (CORRAL_POOL_MODE=controller)
    Kube,
    /// SandboxClaims with fixed deadlines (CORRAL_POOL_MODE=platform_operator)
    AgentSandbox,
}

/// `corral controller`'s tools.
#[derive(Subcommand)]
pub enum ControllerCommand {
    /// Print the workers' NetworkPolicies (a JSON List, for `kubectl apply -f -`), or check some
    ///
    /// Two policies in the workers' namespace (decision 0031): `corral-workers-namespace-deny`
    /// isolates every pod there and admits nothing; `corral-workers` admits every worker's
    /// ingress from this system's API (control and browser ports) and controller (control port)
    /// only (BROW-7), and its egress to the egress proxy, the TURN authority over UDP and TCP and
    /// the package broker only (ISO-5), or to nothing with --isolated (EGR-8). A peer is its
    /// pods in the system namespace (pods:PORT, the pods' port), one address (IP:PORT), or both
    /// (pods+IP:PORT). With --check FILE it prints nothing of its own: it reads the
    /// NetworkPolicies in FILE and judges them over the conformance table for these flags,
    /// printing one line per wrong row (exit 1).
    NetworkPolicy(Box<NetworkPolicyArgs>),
    /// Print the PodTemplate of the pool's worker pods (JSON), as `corral controller --backend
    /// kube` with the same flags and environment creates each pod
    ///
    /// Each pod is this template with the worker's name, its `corral.dev/worker` label, the
    /// `corral.dev/image` annotation and `CORRAL_WORKER_ID`. The pods get this process's
    /// `SANDBOX_EGRESS_PROXY_URL` and, when set, `CORRAL_JAIL_ALLOW_WEAKER_ISOLATION` (decision
    /// 0032). `kind-cluster/check` holds the manifests' PodTemplate to this.
    WorkerPod(Box<WorkerPodArgs>),
}

/// `corral controller worker-pod`.
#[derive(Args)]
pub struct WorkerPodArgs {
    /// The workers' namespace.
    #[command(flatten)]
    pub workers: WorkersNamespace,
    /// The pool's name
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub pool: String,
    /// The worker image, by digest, with `corral` on its PATH
    #[arg(long, value_name = "REF", required = true)]
    pub image: String,
    /// How the pods are made.
    #[command(flatten)]
    pub pod: WorkerPodOptions,
}

/// `corral controller network-policy`.
#[derive(Args)]
pub struct NetworkPolicyArgs {
    /// The workers' namespace (the policies').
    #[command(flatten)]
    pub workers: WorkersNamespace,
    /// The namespace of the API, the controller, the egress proxy and an in-cluster TURN server
    #[arg(long, value_name = "NS", default_value = "corral-system")]
    pub system_namespace: String,
    /// Where workers reach the egress proxy (TCP): pods:PORT, IP:PORT or pods+IP:PORT
    #[arg(
        long,
        value_name = "REACH",
        required_unless_present = "isolated",
        conflicts_with = "isolated"
    )]
    pub proxy: Option<Reach>,
    /// Where workers reach the TURN authority (UDP and TCP): pods:PORT, IP:PORT or pods+IP:PORT
    #[arg(
        long,
        value_name = "REACH",
        required_unless_present = "isolated",
        conflicts_with = "isolated"
    )]
    pub turn: Option<Reach>,
    /// Where workers reach the package broker, the API (TCP): pods:PORT, IP:PORT or pods+IP:PORT
    #[arg(
        long,
        value_name = "REACH",
        required_unless_present = "isolated",
        conflicts_with = "isolated"
    )]
    pub broker: Option<Reach>,
    /// Deny the workers' egress at this layer: egress is isolated, or has no field key or no
    /// proxy (EGR-8)
    #[arg(long)]
    pub isolated: bool,
    /// Judge the NetworkPolicies in FILE (JSON: a List, an array or one object) against the
    /// conformance table for these flags instead of printing them
    #[arg(long, value_name = "FILE")]
    pub check: Option<PathBuf>,
}

/// `corral resources`.
#[derive(Args)]
pub struct ResourcesArgs {
    /// The authority's SQLite database (default: CORRAL_RESOURCE_AUTHORITY_URL's sqlite:// path,
    /// else .corral/resources.db, the one `corral up` uses)
    #[arg(long, value_name = "PATH", global = true)]
    pub db: Option<PathBuf>,
    /// The object store for documents' bytes (default: CORRAL_WORKSPACE_URL, else
    /// .corral/workspaces)
    #[arg(long, value_name = "URL", global = true)]
    pub store: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: ResourcesCommand,
}

/// `corral resources`' commands.
#[derive(Subcommand)]
pub enum ResourcesCommand {
    /// Projects and their members
    #[command(subcommand)]
    Project(ProjectCommand),
    /// Rooms (conversations) and their members
    #[command(subcommand)]
    Room(RoomCommand),
    /// Documents and their versions
    #[command(subcommand)]
    Document(DocumentCommand),
    /// Link a document into a room (a private chat's attachment, a shared room's file)
    Link {
        /// The room
        room: String,
        /// The document's reference
        reference: String,
        /// The turn that linked it (with --member)
        #[arg(long, value_name = "TURN")]
        turn: Option<String>,
        /// The member whose turn it was
        #[arg(long, value_name = "MEMBER")]
        member: Option<String>,
    },
    /// Select a document privately for a member in a room
    Select {
        /// The room
        room: String,
        /// The member
        member: String,
        /// The document's reference
        reference: String,
    },
    /// List a room's documents
    List {
        /// The room
        room: String,
    },
}

/// `corral resources project`.
#[derive(Subcommand)]
pub enum ProjectCommand {
    /// Create a project
    Create {
        /// The project
        project: String,
    },
    /// Add a member to a project
    AddMember(ProjectMember),
    /// Remove a member from a project
    RemoveMember(ProjectMember),
}

/// A project and one of its members.
#[derive(Args)]
pub struct ProjectMember {
    /// The project
    pub project: String,
    /// The member
    pub member: String,
}

/// `corral resources room`.
#[derive(Subcommand)]
pub enum RoomCommand {
    /// Create a room
    Create {
        /// The room
        room: String,
        /// The project it belongs to
        #[arg(long, value_name = "PROJECT")]
        project: Option<String>,
        /// A member; repeat for more
        #[arg(long, value_name = "MEMBER")]
        member: Vec<String>,
    },
    /// Add a member to a room
    AddMember(RoomMember),
    /// Remove a member from a room
    RemoveMember(RoomMember),
}

/// A room and one of its members.
#[derive(Args)]
pub struct RoomMember {
    /// The room
    pub room: String,
    /// The member
    pub member: String,
}

/// `corral resources document`.
#[derive(Subcommand)]
pub enum DocumentCommand {
    /// Add a document (or a new version of one): its bytes go to the object store
    Add(DocumentAdd),
    /// Change a document's processing state or revoke it
    Set {
        /// The document's reference
        reference: String,
        /// Its processing state.
        #[command(flatten)]
        processing: Processing,
        /// Revoke it, or take the revocation back
        #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
        revoked: Option<bool>,
    },
}

/// `corral resources document add`.
#[derive(Args)]
pub struct DocumentAdd {
    /// The member who owns it
    #[arg(long, value_name = "MEMBER")]
    pub owner: String,
    /// The file whose bytes it is
    #[arg(long, value_name = "PATH")]
    pub file: PathBuf,
    /// Its name (default: the file's name)
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Its media type (default: from the name)
    #[arg(long, value_name = "TYPE")]
    pub media_type: Option<String>,
    /// What it is
    #[arg(long, value_enum, default_value_t = DocumentKind::Document)]
    pub kind: DocumentKind,
    /// The root of the document this is a new version of
    #[arg(long, value_name = "ROOT")]
    pub revises: Option<String>,
    /// Its processing state.
    #[command(flatten)]
    pub processing: Processing,
}

/// `--kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DocumentKind {
    /// A document a member provided
    Document,
    /// An artifact a run produced
    Artifact,
}

/// `--processing`: `document add`'s and `document set`'s.
#[derive(Args)]
pub struct Processing {
    /// The document's processing state (a new document's default: ready)
    #[arg(long, value_name = "STATE", value_parser = ["ready", "processing", "failed"])]
    pub processing: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Command {
        let argv = std::iter::once(&"corral").chain(args);
        Cli::try_parse_from(argv).map_or_else(|e| panic!("{args:?}: {e}"), |cli| cli.command)
    }

    #[test]
    fn a_repeated_flag_takes_its_last_value_and_a_repeatable_one_keeps_every_value() {
        let Command::Up(up) = parse(&["up", "--sample", "--sample", "--listen", "127.0.0.1:1"])
        else {
            panic!("not up");
        };
        assert!(up.sample);
        let Command::Run(run) = parse(&["run", "--actor", "a", "x.py", "--actor", "b"]) else {
            panic!("not run");
        };
        assert_eq!(run.actor, "b");
        let Command::Resources(ResourcesArgs {
            command: ResourcesCommand::Room(RoomCommand::Create { member, .. }),
            ..
        }) = parse(&[
            "resources",
            "room",
            "create",
            "r",
            "--member",
            "a",
            "--member",
            "b",
        ])
        else {
            panic!("not room create");
        };
        assert_eq!(member, ["a", "b"]);
    }

    #[test]
    fn resources_take_the_database_and_the_store_before_or_after_the_command() {
        for args in [
            &["resources", "--db", "a.db", "list", "r"][..],
            &["resources", "list", "r", "--db", "a.db"],
        ] {
            let Command::Resources(resources) = parse(args) else {
                panic!("not resources");
            };
            assert_eq!(resources.db, Some(PathBuf::from("a.db")), "{args:?}");
        }
    }
}
