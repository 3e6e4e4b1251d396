/* launch.c — the launcher (fork + exec one worker per GPU, watch them, stop them all on a failure)
 * and the worker's view of the job from its environment (see launch.h). */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "auth.h"
#include "cli.h" /* cli_given */
#include "cpu_threads.h"
#include "device.h"
#include "errors.h"
#include "net.h"
#include "peak.h" /* peak_tflops */
#include "report.h" /* report_check_free */
#include "sampler.h" /* sampler_shard_size */
#include "stop.h" /* signal_repeats: timeout's two copies of one signal */
#include "store.h" /* store_dial: is the store on the port this job's own? */
#include "trace.h" /* trace_check_free */

/* The launcher speaks as the program it launches ("stage3", "stage4", …). */
static char prog[64] = "stage3";

/* A non-negative integer from the environment, or `dflt` when unset or empty. Nothing may follow the
 * digits; leading blanks and a '+' pass, as Python's int() lets them pass for torchrun's variables. */
static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    if (!v || !v[0]) return dflt;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*end || errno || x < 0 || x > INT_MAX) /* 99999999999 too: it is no integer the job can use */
        die_user("environment variable %s='%s' is not an integer from 0 to %d — a launcher (torchrun, srun, "
                 "mpirun) sets it; if it is left over in this shell, unset %s", name, v, INT_MAX, name);
    return (int)x;
}

/* ---- the worker side ------------------------------------------------------------------------- */

/* Started by srun (not the batch script of an sbatch job, nor an salloc shell: those carry
 * SLURM_PROCID=0, SLURM_LOCALID=0 and the allocation's SLURM_NTASKS too, but no step id; srun sets
 * SLURM_STEP_ID, and SLURM_STEPID for older scripts). */
static int slurm_in_step(void) { return getenv("SLURM_STEP_ID") || getenv("SLURM_STEPID"); }

/* The variable to read, the step's own first: srun --export=… or -E (--preserve-env) keeps the
 * allocation's SLURM_NTASKS and SLURM_TASKS_PER_NODE, while SLURM_STEP_* are always this step's. */
static const char *slurm_name(const char *step, const char *job) {
    const char *v = getenv(step);
    return v && v[0] ? step : job;
}

/* The tasks of this srun step, when it is a job to join; 0 otherwise. A step of one task (srun -n 1,
 * or the shell of srun --pty bash) is not: our own launcher decides, as torchrun run inside one would. */
static int slurm_step_tasks(void) {
    if (!getenv("SLURM_PROCID") || !getenv("SLURM_LOCALID") || !slurm_in_step()) return 0;
    int n = env_int(slurm_name("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), 0);
    return n > 1 ? n : 0;
}

/* This node's task count: the tasks-per-node list ("4(x2),3": two nodes of 4, then one of 3)
 * expanded and read at SLURM_NODEID; SLURM_NTASKS_PER_NODE (a job's --ntasks-per-node) when
 * there is no list. The whole world when neither says. A list we cannot read is an error naming it,
 * as for every other launcher variable. */
static int slurm_local_world(int world, int node) {
    const char *name = slurm_name("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE");
    const char *list = getenv(name), *t = list;
    if (list && list[0]) {
        for (long first = 0;;) {
            char *end;
            errno = 0;
            long count = strtol(t, &end, 10), times = 1;
            int ok = end != t && count >= 1 && count <= INT_MAX && !errno;
            if (ok && !strncmp(end, "(x", 2)) {
                times = strtol(end + 2, &end, 10);
                ok = times >= 1 && times <= INT_MAX && !errno && *end++ == ')';
            }
            if (!ok || (*end && *end != ','))
                die_user("environment variable %s='%s' is not a tasks-per-node list like 4(x2),3", name, list);
            if (node < first + times) return (int)count;
            first += times;
            if (!*end)
                die_user("environment variable %s='%s' lists %ld nodes, but this is node %d (SLURM_NODEID)", name,
                         list, first, node);
            t = end + 1;
        }
    }
    int n = env_int("SLURM_NTASKS_PER_NODE", 0);
    return n > 0 ? n : world;
}

/* torchrun's and mpirun's variables (srun's are read by the step functions above); what a worker
 * needs of each set is its first two. An empty variable counts as unset, as env_int reads it. */
static const char *const TORCHRUN_VARS[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                            NULL};
static const char *const MPIRUN_VARS[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "OMPI_COMM_WORLD_LOCAL_SIZE", NULL};
/* MPICH's and Intel MPI's mpirun (Hydra): PMI's rank and size, and the local pair Hydra adds. */
static const char *const PMI_VARS[] = {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", NULL};
static const char *const SRUN_VARS[] = {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_ID",
                                        "SLURM_STEPID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS",
                                        "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
                                        NULL};

static int is_set(const char *name) {
    const char *v = getenv(name);
    return v && v[0];
}

/* The tasks of an MPICH or Intel MPI mpirun, when it is a job to join; 0 otherwise (a job of one task
 * is not one, as for srun). Inside an srun step PMI_RANK and PMI_SIZE are either Slurm's PMI2 plugin's
 * — srun's own numbers, and srun's variables decide, with its local ranks — or those of a Hydra
 * mpirun in a Slurm allocation, which starts its proxies with srun, one task per node: then the step's
 * variables are the proxies' (SLURM_PROCID = the node), and PMI's are the job's. */
static int pmi_tasks(void) {
    if (!is_set("PMI_RANK")) return 0;
    int n = env_int("PMI_SIZE", 0);
    if (n <= 1 || (slurm_in_step() && n == slurm_step_tasks() && env_int("PMI_RANK", 0) == env_int("SLURM_PROCID", -1)))
        return 0;
    return n;
}

/* Which launcher's variables, other than torchrun's, describe this process's job, and its world size
 * (0: none). Open MPI's mpirun sets OMPI_COMM_WORLD_* in its processes, which no srun does, so they come
 * first: in a Slurm allocation mpirun starts its daemons with srun, one task per node, and its processes
 * there also carry that step's variables — the daemons' (SLURM_PROCID = the node, the step's tasks =
 * the nodes). Then Hydra's PMI (pmi_tasks), then srun's step. */
typedef enum { ENV_NONE, ENV_OMPI, ENV_PMI, ENV_SRUN } EnvLauncher;
static EnvLauncher env_launcher(int *world) {
    if (is_set("OMPI_COMM_WORLD_RANK") && is_set("OMPI_COMM_WORLD_SIZE")) {
        *world = env_int("OMPI_COMM_WORLD_SIZE", 1);
        return ENV_OMPI;
    }
    if ((*world = pmi_tasks()) > 0) return ENV_PMI;
    if ((*world = slurm_step_tasks()) > 0) return ENV_SRUN;
    return ENV_NONE;
}

/* Those of vars that are set, as "NAME=value NAME=value" (with_values) or "NAME NAME"; how many. */
static int list_set(const char *const *vars, int with_values, char *out, size_t cap) {
    size_t k = 0;
    int n = 0;
    out[0] = 0;
    for (int i = 0; vars[i]; i++)
        if (is_set(vars[i]) && k < cap)
            n++, k += (size_t)snprintf(out + k, cap - k, "%s%s%s%s", k ? " " : "", vars[i], with_values ? "=" : "",
                                       with_values ? getenv(vars[i]) : "");
    return n;
}

/* What made this process a worker, for the messages that refuse it (set by worker_from_env):
 * "torchrun's variables RANK=0 WORLD_SIZE=2 …", and for torchrun's names that no torchrun set — no
 * TORCHELASTIC_RUN_ID, not our launcher's: launcher "environment", often left over in a shell —
 * how to be rid of them. */
static char origin[640], leftover[400]; /* names (256) + prog (64) + the sentence */

static void describe_origin(const Worker *w, const char *const *vars) {
    char found[512];
    list_set(vars, 1, found, sizeof found);
    leftover[0] = 0;
    if (strcmp(w->launcher, "environment")) {
        snprintf(origin, sizeof origin, "from %s's variables %s", w->launcher, found);
        return;
    }
    char names[256];
    list_set(vars, 0, names, sizeof names);
    snprintf(origin, sizeof origin, "from %s in the environment, torchrun's variables that no torchrun set: "
             "TORCHELASTIC_RUN_ID is unset", found);
    snprintf(leftover, sizeof leftover, "if they are left over in this shell, unset %s to let %s start its own "
             "workers", names, prog);
}

/* A task of an mpirun of `world` tasks, from its four variables in MPIRUN_VARS' order (rank, size,
 * local rank, local size): Open MPI's, or PMI's and Hydra's (MPICH, Intel MPI). */
static void mpirun_worker(Worker *w, const char *const *vars, int world) {
    w->world_size = world;
    w->rank = env_int(vars[0], 0);
    w->local_rank = env_int(vars[2], 0);
    w->local_world_size = env_int(vars[3], w->world_size);
    w->node_rank = w->local_world_size ? w->rank / w->local_world_size : 0;
    w->launcher = "mpirun";
    describe_origin(w, vars);
}

/* The launcher's variables cannot describe this job (flag NULL), or launch flag --flag contradicts
 * them: what is wrong, where it comes from, and the fix — for a leftover set, unsetting it (ours then
 * starts the workers); for a flag under a launcher, the launcher decides. */
_Noreturn __attribute__((format(printf, 2, 3))) static void refuse(const char *flag, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (!flag) die_user("%s (%s)%s%s", what, origin, leftover[0] ? " — " : "", leftover);
    if (leftover[0])
        die_user("%s (%s) — %s; if a launcher of yours set them, drop --%s", what, origin, leftover, flag);
    die_user("%s (%s) — the launcher decides: drop --%s", what, origin, flag);
}

/* A launcher's variables given in part are no job to join, and ignoring them would start workers
 * the user did not ask for: name what is there and what is missing. */
static void refuse_partial(const char *launcher, const char *const *vars) {
    char found[512], names[256], missing[128] = "";
    int n = list_set(vars, 1, found, sizeof found);
    if (!n) return;
    for (int i = 0; i < 2; i++)
        if (!is_set(vars[i]))
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? " and " : "",
                     vars[i]);
    list_set(vars, 0, names, sizeof names);
    die_user("%s %s set, but not %s: a worker needs both %s and %s (as %s sets them) — if %s left over in "
             "this shell, unset %s to let %s start its own workers; as a worker of your own launcher, set %s too",
             found, n == 1 ? "is" : "are", missing, vars[0], vars[1], launcher, n == 1 ? "it is" : "they are", names,
             prog, missing);
}

/* How to change the rendezvous port, in the terms of whoever chose it (store_port_fix): a MASTER_PORT
 * that a launcher or a script set wins over --master-port (which is refused when it differs), and
 * under torchrun's agent store ours is one past the port the user gave torchrun. Our launcher's
 * workers keep the default: their MASTER_PORT is --master-port. */
static void describe_port(const Worker *w, int agent) {
    const char *port = getenv("MASTER_PORT");
    if (!is_set("MASTER_PORT") || !strcmp(w->launcher, prog)) return;
    if (agent)
        snprintf(store_port_fix, sizeof store_port_fix, "torchrun's agent holds MASTER_PORT=%s for its own store, "
                 "and ours takes the next port, %d: give torchrun a --master-port P below 65535 with P + 1 free too",
                 port, w->master_port);
    else if (!strcmp(w->launcher, "torchrun"))
        snprintf(store_port_fix, sizeof store_port_fix, "the port is torchrun's MASTER_PORT=%s: give torchrun a free "
                 "--master-port", port);
    else
        snprintf(store_port_fix, sizeof store_port_fix, "the port is MASTER_PORT=%s from the environment, which "
                 "--master-port cannot override: export a free MASTER_PORT to every rank", port);
}

/* RANK and WORLD_SIZE that no torchrun set, in a task of srun or mpirun: they win over the
 * launcher's own (torchrun run inside srun sets them so), but an sbatch script's `export
 * RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS` is evaluated once, in the script: every task is then
 * rank 0, and they fail as 'two workers given RANK=0' on one node, 'not an address of this machine'
 * on another — with the leftover's advice to let stage3 start its own workers. A RANK that differs
 * from the launcher's rank in a world of the launcher's size is that mistake, and a world smaller than
 * the launcher's tasks (RANK=0 WORLD_SIZE=1 left over in a shell: each task trained alone) is no job
 * at all: both refused, with the fix. A larger world is a launcher of the user's own inside each task
 * (one task per node starting several workers): left alone. */
static void exported_for_every_task(const Worker *w) {
    int world;
    const EnvLauncher other = env_launcher(&world);
    if (other == ENV_NONE) return;
    const char *who = other == ENV_SRUN ? "srun" : "mpirun",
               *rank_var = other == ENV_OMPI ? "OMPI_COMM_WORLD_RANK" : other == ENV_PMI ? "PMI_RANK" : "SLURM_PROCID";
    const int rank = env_int(rank_var, 0);
    if (w->world_size > world || (w->world_size == world && rank == w->rank)) return;
    die_user("this is %s's task %s=%d of %d, but RANK=%d WORLD_SIZE=%d — given to every task alike (%s): unset them, "
             "and %s's own variables decide, or set them per task (%s bash -c 'RANK=$%s … ./%s …') (%s)", who,
             rank_var, rank, world, w->rank, w->world_size,
             strcmp(who, "srun") ? "exported in the shell that started mpirun"
                                 : "a batch script's export RANK=$SLURM_PROCID is evaluated once, in the script; or left "
                                   "over in the shell",
             who, who, rank_var, prog, origin);
}

/* torchrun numbers each node's workers in one block: its agent gives node GROUP_RANK the ranks
 * first … first + LOCAL_WORLD_SIZE - 1, first being the workers of nodes 0 … GROUP_RANK - 1 (at least
 * one each), and RANK = first + LOCAL_RANK. Variables that break this came from two jobs, or from a
 * script that set one by hand: refused, not run with a node rank (--node-rank's check) or a local
 * rank (the GPU, the cores' share) that is not this worker's. srun and mpirun are not held to it:
 * their cyclic distributions number the ranks across the nodes. A LOCAL_WORLD_SIZE left unset is
 * not checked (its default, the world, would make every job one node): hand-started workers of
 * several nodes may leave it out. */
static void torchrun_layout_check(const Worker *w) {
    int first = w->rank - w->local_rank;
    if (first < 0)
        refuse(NULL, "LOCAL_RANK=%d is above RANK=%d: a worker's rank is its node's first rank plus its local "
               "rank (as torchrun numbers them) — check LOCAL_RANK", w->local_rank, w->rank);
    if (is_set("LOCAL_WORLD_SIZE") && first + w->local_world_size > w->world_size)
        refuse(NULL, "RANK=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d put this node's ranks at %d … %d, past WORLD_SIZE=%d "
               "— check LOCAL_RANK and LOCAL_WORLD_SIZE", w->rank, w->local_rank, w->local_world_size, first,
               first + w->local_world_size - 1, w->world_size);
    if (w->node_rank > 0 && is_set("LOCAL_WORLD_SIZE") && w->local_world_size == w->world_size)
        refuse(NULL, "GROUP_RANK=%d, but LOCAL_WORLD_SIZE = WORLD_SIZE = %d makes this a job of one node, node 0 "
               "— check GROUP_RANK (or LOCAL_WORLD_SIZE, for a job of several nodes)", w->node_rank, w->world_size);
    if (w->node_rank > first)
        refuse(NULL, "GROUP_RANK=%d, but this node's first rank is %d (RANK - LOCAL_RANK%s): each node before it "
               "holds a worker at least, so GROUP_RANK is at most %d — check GROUP_RANK and LOCAL_RANK",
               w->node_rank, first, is_set("LOCAL_RANK") ? "" : "; an unset LOCAL_RANK is RANK", first);
}

/* --master-addr is a host alone, and so is MASTER_ADDR (from: who exported it, NULL for the flag).
 * Written with its port (torchrun's --rdzv-endpoint form), in brackets or as a URL it does not
 * resolve — which node 0 reports as a host name problem, and any other node only after
 * --rdzv-timeout: say how to write it instead, at once, on every node. */
static void check_master_addr(const char *addr, const char *from) {
    const char *colon = strchr(addr, ':'), *name = from ? "MASTER_ADDR" : "--master-addr",
               *set = from ? "MASTER_ADDR=" : "--master-addr ", *port = from ? "MASTER_PORT" : "--master-port";
    char by[128] = "";
    if (from) snprintf(by, sizeof by, " (%s)", from);
    if (strstr(addr, "://"))
        die_user("%s '%s' is a URL: give the host alone (e.g. %s10.0.0.1) and its port with %s%s", name, addr, set,
                 port, by);
    if (addr[0] == '[')
        die_user("%s '%s': write an IPv6 address without brackets (%s%.*s), and its port with %s%s", name, addr, set,
                 (int)strcspn(addr + 1, "]"), addr + 1, port, by);
    if (colon && !strchr(colon + 1, ':')) /* one colon: host:port (an IPv6 address has two or more) */
        die_user("%s '%s' carries a port: give them apart, %s%.*s %s%s%s%s", name, addr, set, (int)(colon - addr),
                 addr, port, from ? "=" : " ", colon + 1, by);
}

/* Fill w from the launcher's variables; 0 when there are none (we are to launch). */
static int worker_from_env(const LaunchConfig *cfg, Worker *w) {
    memset(w, 0, sizeof *w);
    const char *addr = getenv("MASTER_ADDR");
    snprintf(w->master_addr, sizeof w->master_addr, "%s", addr && addr[0] ? addr : cfg->master_addr);
    w->master_port = env_int("MASTER_PORT", cfg->master_port);
    const char *world_var = "WORLD_SIZE", *rank_var = "RANK";
    /* the local rank's and the local size's source, for the error that refuses them (torchrun's
     * defaults, when unset, are RANK and WORLD_SIZE) */
    char local_var[64] = "LOCAL_RANK", local_size_var[96] = "LOCAL_WORLD_SIZE";
    int agent = 0, world = 0;
    EnvLauncher other;
    if (is_set("RANK")) {
        if (!is_set("WORLD_SIZE")) refuse_partial("torchrun", TORCHRUN_VARS);
        w->rank = env_int("RANK", 0);
        w->world_size = env_int("WORLD_SIZE", 1);
        w->local_rank = env_int("LOCAL_RANK", w->rank);
        w->local_world_size = env_int("LOCAL_WORLD_SIZE", w->world_size);
        w->node_rank = env_int("GROUP_RANK", 0);
        w->launcher = getenv("STAGE3_STATUS_FD")      ? prog
                      : getenv("TORCHELASTIC_RUN_ID") ? "torchrun"
                                                      : "environment";
        describe_origin(w, TORCHRUN_VARS);
        if (!strcmp(w->launcher, "environment")) exported_for_every_task(w);
        if (!is_set("LOCAL_RANK")) snprintf(local_var, sizeof local_var, "LOCAL_RANK (unset: RANK)");
        if (!is_set("LOCAL_WORLD_SIZE"))
            snprintf(local_size_var, sizeof local_size_var, "LOCAL_WORLD_SIZE (unset: WORLD_SIZE)");
        /* torchrun's agent hosts its own TCPStore on MASTER_PORT and tells its workers to share it;
         * we speak our own protocol, so ours goes next door. */
        const char *store = getenv("TORCHELASTIC_USE_AGENT_STORE");
        agent = store && !strcmp(store, "True");
        w->master_port += agent;
    } else if ((other = env_launcher(&world)) == ENV_OMPI || other == ENV_PMI) {
        const char *const *vars = other == ENV_OMPI ? MPIRUN_VARS : PMI_VARS;
        mpirun_worker(w, vars, world);
        rank_var = vars[0], world_var = vars[1];
        snprintf(local_var, sizeof local_var, "%s", vars[2]);
        snprintf(local_size_var, sizeof local_size_var, "%s%s", vars[3], is_set(vars[3]) ? "" : " (unset: the world size)");
    } else if (other == ENV_SRUN) {
        w->world_size = world;
        w->rank = env_int("SLURM_PROCID", 0);
        w->local_rank = env_int("SLURM_LOCALID", 0);
        w->node_rank = env_int("SLURM_NODEID", 0);
        w->local_world_size = slurm_local_world(w->world_size, w->node_rank);
        w->launcher = "srun";
        rank_var = "SLURM_PROCID", world_var = slurm_name("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS");
        describe_origin(w, SRUN_VARS);
        const char *list = slurm_name("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE");
        snprintf(local_var, sizeof local_var, "SLURM_LOCALID");
        if (is_set(list) || is_set("SLURM_NTASKS_PER_NODE"))
            snprintf(local_size_var, sizeof local_size_var, "%s's count for node %d",
                     is_set(list) ? list : "SLURM_NTASKS_PER_NODE", w->node_rank);
        else
            snprintf(local_size_var, sizeof local_size_var, "%s (no tasks-per-node variable: one node)", world_var);
    } else {
        /* Complete sets of another launcher come first (an sbatch script often exports WORLD_SIZE
         * for srun's tasks); a partial set alone is refused. */
        refuse_partial("torchrun", TORCHRUN_VARS);
        refuse_partial("mpirun", MPIRUN_VARS);
        int tasks = env_int("SLURM_NTASKS", 0);
        if (getenv("SLURM_PROCID") && tasks > 1 && !slurm_in_step())
            printf("%s: note: a Slurm job of %d tasks, but this is its batch script, not an srun task: the job "
                   "runs on this node only — start it with srun (srun ./%s …) to use every task\n", prog, tasks, prog);
        return 0;
    }
    describe_port(w, agent);
    /* MASTER_ADDR that another launcher or a script exported wins over --master-addr (refused below when
     * they differ): the store's errors name it, and its form is checked as the flag's is */
    if (addr && addr[0] && strcmp(w->launcher, prog)) {
        const char *from = !strcmp(w->launcher, "torchrun") ? "torchrun sets it from its own --master-addr"
                                                             : "exported to every rank by your job script";
        check_master_addr(addr, from);
        snprintf(store_addr_name, sizeof store_addr_name, "MASTER_ADDR (%s)", from);
    }
    if (strcmp(w->launcher, prog)) { /* the address and port as they were set; not our --nnodes, --node-rank */
        int a = addr && addr[0], p = is_set("MASTER_PORT"), tr = !strcmp(w->launcher, "torchrun");
        const char *who = tr ? "torchrun sets them from its own --master-addr and --master-port"
                             : "exported to every rank by your job script";
        if (a && p)
            snprintf(store_endpoint, sizeof store_endpoint, "MASTER_ADDR and MASTER_PORT (%s%s)", who,
                     agent ? "; our store is on MASTER_PORT + 1" : "");
        else
            snprintf(store_endpoint, sizeof store_endpoint, "%s and %s", store_addr_name,
                     p ? "MASTER_PORT (exported to every rank by your job script)" : "--master-port");
        snprintf(store_join_check, sizeof store_join_check, "%s", store_endpoint);
    }
    if (strcmp(w->launcher, prog) && cfg->standalone) { /* the port is the other launcher's to pick */
        /* MASTER_PORT as it was set (under torchrun's agent, ours is one above it); srun and mpirun
         * often set none, and their ranks meet at the agreed --master-port */
        const char *who = strcmp(w->launcher, "environment") ? w->launcher : "your script",
                   *own = strcmp(w->launcher, "torchrun") ? "" : " — torchrun has a --standalone of its own";
        if (is_set("MASTER_PORT"))
            refuse("standalone", "%s started this worker and set its rendezvous port (MASTER_PORT=%s)%s", who,
                   getenv("MASTER_PORT"), own);
        refuse("standalone", "%s started this worker, and its ranks meet at one agreed port (--master-port, %d "
               "here), which no rank can pick alone%s", who, w->master_port, own);
    }
    if (strcmp(w->launcher, prog)) { /* another launcher's variables set the job's shape, not our flags */
        snprintf(store_world_fix, sizeof store_world_fix, "every rank needs the same %s (%s sets it)", world_var,
                 strcmp(w->launcher, "environment") ? w->launcher : "your script");
        snprintf(store_rank_fix, sizeof store_rank_fix, "check %s: each rank needs its own (%s sets it)", rank_var,
                 strcmp(w->launcher, "environment") ? w->launcher : "your script");
    }
    if (w->world_size < 1)
        refuse(NULL, "%s=%d: the world size must be at least 1", world_var, w->world_size);
    /* A larger world cannot rendezvous (a WORLD_SIZE=2147483647 waited, then named the missing
     * ranks one store request at a time: for ever) */
    if (w->world_size > STORE_MAX_WORLD)
        refuse(NULL, "%s=%d: a job has at most %d ranks (rank 0's rendezvous store serves one connection "
               "each) — check %s", world_var, w->world_size, STORE_MAX_WORLD, world_var);
    if (w->rank >= w->world_size)
        refuse(NULL, "rank %d of a world of %d: %s must be below %s", w->rank, w->world_size, rank_var, world_var);
    if (w->local_world_size < 1 || w->local_rank >= w->local_world_size)
        refuse(NULL, "local rank %d of %d workers per node is out of range: %s must be below %s — check them", w->local_rank,
               w->local_world_size, local_var, local_size_var);
    if (w->local_world_size > w->world_size)
        refuse(NULL, "%d workers per node but %d in the whole job: a node cannot hold more workers than the job — "
               "check LOCAL_WORLD_SIZE (or the launcher's own local size)", w->local_world_size, w->world_size);
    if (!strcmp(rank_var, "RANK")) torchrun_layout_check(w);
    if (w->master_port < 1 || w->master_port > 65535)
        die_user("the rendezvous port %d is out of range (1–65535) — %s", w->master_port, store_port_fix);
    /* Started by another launcher, our own launch flags would be silently ignored: say so when they
     * contradict it (our launcher passes the same argv on, with the same counts). */
    if (cfg->nproc_per_node > 0 && cfg->nproc_per_node != w->local_world_size)
        refuse("nproc-per-node", "this node runs %d worker%s, but --nproc-per-node says %d", w->local_world_size,
               w->local_world_size == 1 ? "" : "s", cfg->nproc_per_node);
    if (cfg->nnodes > 1 && cfg->nnodes * w->local_world_size != w->world_size)
        refuse("nnodes", "the job has %d worker%s, but --nnodes %d × %d per node says %d", w->world_size,
               w->world_size == 1 ? "" : "s", cfg->nnodes, w->local_world_size, cfg->nnodes * w->local_world_size);
    if (cli_given("node-rank") && cfg->node_rank != w->node_rank)
        refuse("node-rank", "this is node %d, but --node-rank says %d", w->node_rank, cfg->node_rank);
    const char *port = getenv("MASTER_PORT");
    if (port && cli_given("master-port") && env_int("MASTER_PORT", 0) != cfg->master_port)
        refuse("master-port", "the rendezvous port is MASTER_PORT=%s, which the launcher or your job script exported "
               "to every rank (change the port there), but --master-port says %d", port, cfg->master_port);
    if (addr && addr[0] && cli_given("master-addr") && strcmp(addr, cfg->master_addr))
        refuse("master-addr", "the rendezvous address is MASTER_ADDR=%s, which the launcher or your job script "
               "exported to every rank (change the address there), but --master-addr says %s", addr, cfg->master_addr);
    /* A job of workers started by hand needs its secret like any other (store.h); without one, a
     * leftover set is the likelier story, so name it first. */
    uint8_t secret[AUTH_MAX_SECRET];
    if (leftover[0] && !auth_secret(secret, sizeof secret))
        die_user("this process is rank %d of %d (%s), but has no rendezvous secret — %s; as a worker of your own "
                 "launcher, export STAGE_RDZV_SECRET=$(openssl rand -hex 32) for every rank", w->rank, w->world_size,
                 origin, leftover);
    /* With a secret exported (as the multi-node recipe does) the same leftover set starts a worker that
     * waits for ranks that never come, or trains alone: say where its rank came from, before any of it. */
    if (leftover[0])
        fprintf(stderr, "note: this process is rank %d of %d (%s) — %s\n", w->rank, w->world_size, origin, leftover);
    return 1;
}

int launch_node_gpus(const char *launcher, int gpus, int local_workers) {
    /* srun / mpirun often give each task its own GPU (CUDA_VISIBLE_DEVICES per task): one visible
     * GPU is then this worker's own. */
    int per_task_gpu = gpus == 1 && (!strcmp(launcher, "srun") || !strcmp(launcher, "mpirun"));
    return per_task_gpu ? local_workers : gpus;
}

void launch_resolve(const LaunchConfig *cfg, const char *launcher, int gpus, int local_workers,
                    int *cuda, CommKind *comm) {
    if (!strcmp(cfg->device, "cuda") && gpus == 0)
        die_user("--device cuda: no CUDA GPU is visible — run with --device cpu");
    *cuda = !strcmp(cfg->device, "cuda") || (!strcmp(cfg->device, "auto") && gpus > 0);
    *comm = comm_choose(cfg->comm, *cuda, launch_node_gpus(launcher, gpus, local_workers), local_workers);
}

int launch_gpu_of(const Worker *w, int gpus) { return gpus > 0 ? w->local_rank % gpus : 0; }

/* ---- the launcher ---------------------------------------------------------------------------- */

static volatile sig_atomic_t got_signal, n_signals; /* the first signal; how many came (one thread) */
static SignalSender first_signal;                    /* its sender: a repeat of it is no second (stop.h) */
static volatile sig_atomic_t got_tstp, n_cont;       /* Ctrl-Z: pause the workers with us; SIGCONTs seen */
static sig_atomic_t cont_at_tstp;                    /* n_cont when the Ctrl-Z came */
static void on_signal(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    SignalSender now = signal_sender(sig, si);
    if (!got_signal) got_signal = sig, first_signal = now;
    else if (signal_repeats(&first_signal, &now)) return; /* `timeout`'s second copy: not "again" */
    n_signals++;
}
static void on_tstp(int sig) { (void)sig, got_tstp = 1, cont_at_tstp = n_cont; }
static void on_cont(int sig) { (void)sig, n_cont++; }
static StatusSlot *page; /* the workers' status slots (worker_status.h) */
static void on_child(int sig) { (void)sig; } /* only wakes sigsuspend: the wait loop reaps */

/* How many GPUs are visible, asked in a child process: the launcher itself must never touch CUDA,
 * or the workers it forks would inherit a half-initialised driver. */
static int count_gpus(void) {
    int p[2];
    CHECK_SYS(pipe(p));
    fflush(stdout);
    pid_t pid = fork();
    CHECK_SYS(pid);
    if (pid == 0) {
        close(p[0]);
        int n = device_cuda_count();
        if (write(p[1], &n, sizeof n) != sizeof n) _exit(1);
        _exit(0);
    }
    close(p[1]);
    int n = 0;
    if (read(p[0], &n, sizeof n) != sizeof n) n = 0;
    close(p[0]);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
    return n;
}

typedef struct Child {
    pid_t pid;
    int rank, local_rank;
    int status, reaped, stopped_by_us;
    int passed;               /* the signal the launcher passed on to it (pass_signal_on), or 0 */
    int64_t stop_ns;          /* when stop_all first stopped it (status_clock_ns), 0 if never */
    int sigstopped, stop_sig; /* stopped now (SIGSTOP, SIGTSTP…): it answers no one, yet has not failed */
    int64_t reap_ns;
} Child;

static void set_env_int(const char *name, int v) {
    char b[24];
    snprintf(b, sizeof b, "%d", v);
    setenv(name, b, 1);
}

static void reap(Child *ch, int n, pid_t pid, int status) {
    for (int i = 0; i < n; i++)
        if (ch[i].pid == pid && (WIFSTOPPED(status) || WIFCONTINUED(status))) {
            ch[i].sigstopped = WIFSTOPPED(status), ch[i].stop_sig = WIFSTOPPED(status) ? WSTOPSIG(status) : 0;
            return;
        } else if (ch[i].pid == pid) {
            ch[i].status = status, ch[i].reaped = 1, ch[i].reap_ns = status_clock_ns();
            return;
        }
}

static int failed(const Child *c) {
    return c->reaped && !(WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0);
}

/* Had chosen to exit (its status slot's exit_ns) before stop_all stopped it: still inside exit(), a
 * GPU context's teardown, when the SIGKILL after the grace period came. Its failure is its own. */
static int exiting_when_stopped(const Child *c) {
    const int64_t exit_ns = page ? __atomic_load_n(&page[c->local_rank].exit_ns, __ATOMIC_RELAXED) : 0;
    return exit_ns && c->stop_ns && exit_ns < c->stop_ns;
}

/* Ended by the SIGTERM or SIGKILL of stop_all, not by its own failure. */
static int killed_by_us(const Child *c) {
    if (!WIFSIGNALED(c->status) || exiting_when_stopped(c)) return 0;
    int sig = WTERMSIG(c->status);
    return (c->stopped_by_us && (sig == SIGTERM || sig == SIGKILL)) || (c->passed && sig == c->passed);
}

static int unreaped(const Child *ch, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) k += !ch[i].reaped;
    return k;
}

/* Is a live worker writing a checkpoint (stop.h: it stops once the file is complete)? */
static int saving(const Child *ch, int n) {
    for (int i = 0; i < n; i++)
        if (page && !ch[i].reaped && __atomic_load_n(&page[i].saving, __ATOMIC_SEQ_CST)) return 1;
    return 0;
}

/* SIGTERM every live worker, SIGKILL the ones still alive after the grace period — or, while one is
 * writing a checkpoint, after it is written (LAUNCH_SAVE_S at most) — and reap them all. */
static void stop_all(Child *ch, int n) {
    for (int i = 0; i < n; i++) /* abort first: a worker that saves must not take this SIGTERM as a request */
        if (page) __atomic_store_n(&page[i].abort, 1, __ATOMIC_RELAXED);
    /* One that has chosen to exit already gets no SIGTERM, which would end it mid-exit, as one we stopped,
     * and lose its failure (it may be the first): it ends with its own code, or the SIGKILL below. */
    const int64_t now = status_clock_ns();
    for (int i = 0; i < n; i++)
        if (!ch[i].reaped) {
            if (!ch[i].stop_ns) ch[i].stop_ns = now;
            ch[i].stopped_by_us = 1;
            if (!page || !__atomic_load_n(&page[i].exit_ns, __ATOMIC_RELAXED)) kill(ch[i].pid, SIGTERM);
            kill(ch[i].pid, SIGCONT);
        }
    int64_t deadline = status_clock_ns() + (int64_t)(LAUNCH_GRACE_S * 1e9);
    const int64_t save_limit = status_clock_ns() + (int64_t)(LAUNCH_SAVE_S * 1e9);
    int sent_kill = 0;
    for (;;) {
        if (!unreaped(ch, n)) return;
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            reap(ch, n, pid, st);
            continue;
        }
        if (pid < 0 && errno == ECHILD) return;
        if (!sent_kill && status_clock_ns() > deadline && (!saving(ch, n) || status_clock_ns() > save_limit)) {
            for (int i = 0; i < n; i++)
                if (!ch[i].reaped) kill(ch[i].pid, SIGKILL);
            sent_kill = 1;
            deadline = status_clock_ns() + (int64_t)(LAUNCH_GRACE_S * 1e9);
        } else if (sent_kill && status_clock_ns() > deadline) {
            return; /* stuck in the kernel (a GPU driver call): SIGKILL will take it when it returns */
        }
        usleep(5000);
    }
}

/* Exited 128 + SIG after stopping early for it, saved (stop.h; launch_mark_stopped): no failure. */
static int stopped_clean(const Child *c, const StatusSlot *slot) {
    int64_t sig = __atomic_load_n(&slot->stopped, __ATOMIC_RELAXED);
    return c->reaped && sig && WIFEXITED(c->status) && WEXITSTATUS(c->status) == 128 + sig;
}

/* Ctrl-Z: the workers are in sessions of their own (the terminal stops only the launcher's group), so
 * the launcher stops them, then itself, as the terminal would have stopped them all; the shell's `fg`
 * or `bg` continues the launcher, which continues them. */
static void pause_with_workers(Child *ch, int n) {
    got_tstp = 0;
    for (int i = 0; i < n; i++)
        if (!ch[i].reaped) kill(ch[i].pid, SIGSTOP);
    if (n_cont == cont_at_tstp) raise(SIGSTOP); /* returns once we are continued (unless that came already) */
    for (int i = 0; i < n; i++)
        if (!ch[i].reaped) kill(ch[i].pid, SIGCONT);
}

/* A failure of its own while the job stops for a signal: not a clean stop, not the passed signal's
 * or our kill, not a consequence of another rank's going (collateral) — a crash, a full disk. */
static int own_failure(const Child *c, const StatusSlot *slot) {
    return failed(c) && !stopped_clean(c, slot) && !killed_by_us(c) &&
           !__atomic_load_n(&slot->collateral, __ATOMIC_RELAXED);
}

/* The launcher got SIGINT, SIGTERM, SIGHUP or SIGQUIT (the four torchrun's agent handles): send each
 * worker the same once (SIGTERM for SIGHUP and SIGQUIT: a hung-up terminal or a Ctrl-\ is no reason
 * to lose the run), then wait. A worker without --save dies of it at
 * once; one with --save says it is on its way (its handler marks the status page) and stops at a step
 * every rank agrees on, evaluates, saves: that takes what it takes (up to --log-every steps, then an
 * evaluation and a write), so such workers are waited for without a limit — a second signal to the
 * launcher stops them at once (passed on with the page's abort mark). A worker that never says so (still
 * starting, or stuck) is stopped after LAUNCH_STOP_S, torchrun's wait. Returns 1 if a worker failed
 * on its own meanwhile (the caller reports that failure), else 0, every worker reaped. */
static int pass_signal_on(Child *ch, int n, int sig) {
    int fwd = sig == SIGHUP || sig == SIGQUIT ? SIGTERM : sig, handled = 1, broken = 0;
    for (int i = 0; i < n; i++)
        if (!ch[i].reaped) {
            __atomic_store_n(&page[i].passed, fwd, __ATOMIC_SEQ_CST); /* before the kill: see stop.c */
            ch[i].passed = fwd, kill(ch[i].pid, fwd), kill(ch[i].pid, SIGCONT);
        }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL); /* a second signal must be seen while we wait */
    const int64_t grace = (int64_t)(LAUNCH_GRACE_S * 1e9);
    int64_t give_up = status_clock_ns() + (int64_t)(LAUNCH_STOP_S * 1e9); /* on a silent worker */
    while (unreaped(ch, n)) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG | WUNTRACED | WCONTINUED);
        if (pid > 0) {
            reap(ch, n, pid, st);
            for (int i = 0; i < n; i++) {
                if (ch[i].pid != pid || !ch[i].reaped) continue;
                if (own_failure(&ch[i], &page[i])) return 1;
                /* gone without a clean stop (the signal's default, a peer lost): the others cannot stop
                 * cleanly any more (the vote needs every rank), so they get the grace period */
                if (!stopped_clean(&ch[i], &page[i]) && !broken) broken = 1, give_up = status_clock_ns() + grace;
            }
            continue;
        }
        if (pid < 0 && errno == ECHILD) break;
        if (got_tstp) pause_with_workers(ch, n);
        if (n_signals > handled) { /* again: stop at once. The abort mark makes any delivery of the signal
                                    * do it — a second kill of the same signal may merge with a first
                                    * still pending, and then the worker would see only one */
            handled = n_signals;
            for (int i = 0; i < n; i++) __atomic_store_n(&page[i].abort, 1, __ATOMIC_RELAXED);
            for (int i = 0; i < n; i++)
                if (!ch[i].reaped) kill(ch[i].pid, fwd);
            broken = 1, give_up = status_clock_ns() + grace;
        }
        int silent = 0; /* alive, and not on its way to a clean stop (or no clean stop possible) */
        for (int i = 0; i < n; i++)
            silent += !ch[i].reaped && (broken || !__atomic_load_n(&page[i].stopping, __ATOMIC_RELAXED));
        if (silent && status_clock_ns() > give_up) break;
        usleep(5000);
    }
    for (int i = 0; i < n; i++) /* a worker stopped (SIGSTOP) while the others gave up on it: its failure */
        if (!ch[i].reaped && ch[i].sigstopped) return 1;
    stop_all(ch, n);
    for (int i = 0; i < n; i++)
        if (own_failure(&ch[i], &page[i])) return 1;
    return 0;
}

static void describe_exit(const Child *c, const StatusSlot *slot, char *buf, size_t len) {
    char how[64], when[96];
    if (WIFEXITED(c->status)) snprintf(how, sizeof how, "exited with code %d", WEXITSTATUS(c->status));
    else
        snprintf(how, sizeof how, "was killed by signal %d (SIG%s)", WTERMSIG(c->status),
                 status_signal_name(WTERMSIG(c->status)));
    int64_t step = __atomic_load_n(&slot->step, __ATOMIC_RELAXED);
    /* where it was: in a step, or past one — evaluating, or at the checkpoint (saving, or rank 0's
     * write awaited) — where an out-of-memory is not the training step's */
    int at_end = (int)__atomic_load_n(&slot->epoch_end, __ATOMIC_RELAXED);
    int saving = (int)__atomic_load_n(&slot->saving, __ATOMIC_RELAXED);
    if (saving) snprintf(when, sizeof when, "while writing the checkpoint after step %lld", (long long)step);
    else if (at_end && step > 0)
        snprintf(when, sizeof when, "after step %lld, evaluating or at the epoch's checkpoint", (long long)step);
    else if (at_end) snprintf(when, sizeof when, "while evaluating (before any step)");
    else if (step > 0) snprintf(when, sizeof when, "at step %lld", (long long)step);
    else snprintf(when, sizeof when, "during setup (before step 1)");
    if (c->sigstopped) /* the failure is the others' timeout: this one stopped answering them */
        snprintf(how, sizeof how, "was stopped by SIG%s and stopped answering", status_signal_name(c->stop_sig));
    else if (WIFSIGNALED(c->status) && exiting_when_stopped(c)) /* its exit code is lost with it */
        snprintf(how, sizeof how, "chose to exit, and was still exiting when killed (SIG%s)",
                 status_signal_name(WTERMSIG(c->status)));
    snprintf(buf, len, "rank %d (local rank %d, pid %d) %s %s", c->rank, c->local_rank, (int)c->pid, how, when);
}

/* Killed by a SIGPIPE of its own: its standard output's reader went away (`./stage3 | head`), and
 * cli.c's handler has said so. Not a failure of the run; the launcher ends the others quietly. */
static int died_of_closed_output(const Child *c) {
    return c->reaped && !killed_by_us(c) && !c->sigstopped && WIFSIGNALED(c->status) && WTERMSIG(c->status) == SIGPIPE;
}

/* When a reaped worker failed: when it chose to exit, or when we saw it die (of a signal). */
static int64_t failure_ns(const Child *c, const StatusSlot *slot) {
    int64_t t = __atomic_load_n(&slot->exit_ns, __ATOMIC_RELAXED);
    return t ? t : c->reap_ns;
}

/* The root cause among the workers that failed so far: one whose failure was not caused by a peer's
 * (not stopped by us, not marked collateral), the earliest (when it chose to exit, or when we saw it die).
 * -1 if none failed. */
static int first_failure(const Child *ch, const StatusSlot *slots, int n) {
    int root = -1, best_collateral = 1;
    int64_t best = INT64_MAX;
    for (int i = 0; i < n; i++) {
        if (!failed(&ch[i]) || killed_by_us(&ch[i]) || stopped_clean(&ch[i], &slots[i])) continue;
        int coll = (int)__atomic_load_n(&slots[i].collateral, __ATOMIC_RELAXED);
        int64_t t = failure_ns(&ch[i], &slots[i]);
        if (root < 0 || coll < best_collateral || (coll == best_collateral && t < best))
            root = i, best = t, best_collateral = coll;
    }
    return root;
}

_Noreturn static void launcher_run(char **argv, const LaunchConfig *cfg) {
    /* A launcher started with SIGCHLD ignored (some job wrappers do that, and exec keeps it) would
     * never see a worker exit — the kernel reaps them — and would report a failed job as a success.
     * A handler of our own (reset to the default in the workers by exec) brings the exits back. */
    struct sigaction child = {.sa_handler = on_child};
    sigemptyset(&child.sa_mask);
    sigaction(SIGCHLD, &child, NULL);
    int gpus = strcmp(cfg->device, "cpu") ? count_gpus() : 0;
    int cuda;
    CommKind comm;
    int n = cfg->nproc_per_node;
    if (n == 0) { /* one per GPU, as `torchrun --nproc-per-node gpu` */
        int probe_cuda = !strcmp(cfg->device, "cuda") || (!strcmp(cfg->device, "auto") && gpus > 0);
        n = probe_cuda ? gpus : 2;
    }
    launch_resolve(cfg, prog, gpus, n, &cuda, &comm);
    /* Far more CPU workers than cores do not make a slow job but a broken one: starved of the CPU,
     * rank 0 cannot answer the rendezvous before the others time out, and every rank fails. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (!cuda && cores > 0 && n > LAUNCH_CPU_WORKERS_PER_CORE * cores)
        die_user("--nproc-per-node %d: %d CPU workers on %ld core%s would starve one another (rank 0 cannot "
                 "answer the rendezvous in time) — use at most %ld here (%d per core)", n, n, cores,
                 cores == 1 ? "" : "s", LAUNCH_CPU_WORKERS_PER_CORE * cores, LAUNCH_CPU_WORKERS_PER_CORE);
    if (cfg->node_rank >= cfg->nnodes)
        die_user("--node-rank %d must be below --nnodes %d (nodes are numbered from 0)", cfg->node_rank,
                 cfg->nnodes);
    int world = cfg->nnodes * n, first = cfg->node_rank * n;
    if (world > STORE_MAX_WORLD) /* rank 0's store could not serve them all (and would ask for a file each) */
        die_user("--nnodes %d × --nproc-per-node %d is %d ranks: a job has at most %d (rank 0's rendezvous store "
                 "serves one connection each) — use fewer nodes or workers per node", cfg->nnodes, n, world,
                 STORE_MAX_WORLD);

    /* Outputs another run is writing (or another user's): refused here, with the workers' own message,
     * before a rendezvous that every rank would wait through for rank 0 to find it. */
    if (cfg->node_rank == 0) { /* rank 0 writes them: the report, and the checkpoints (save.c) */
        report_check_free(cfg->report);
        cli_check_dir_takes_files("--report", cfg->report, "report.jsonl", 1);
        if (cfg->save && cfg->save[0]) { /* rank 0 would make it and find it unwritable only after the launch */
            make_dirs("--save", cfg->save);
            cli_check_dir_takes_files("--save", cfg->save, "checkpoints", 0);
        }
    }
    trace_check_free(cfg->trace, first, n, world);
    if (cfg->train_size > 0) sampler_shard_size(cfg->train_size, world, cfg->drop_last); /* each rank would, alike */
    double need = n * cfg->data_bytes, have = host_mem_available(); /* every worker holds both sets whole */
    if (cfg->data_bytes > 0 && have > 0 && need > have)
        die_user("each worker holds the whole training and test sets in host memory (%.2f GiB): %d worker%s "
                 "%.1f GiB, more than the %.1f GiB available here — give a smaller --train-size or --test-size%s",
                 cfg->data_bytes / 1073741824.0, n, n == 1 ? " needs" : "s need", need / 1073741824.0,
                 have / 1073741824.0, n == 1 ? "" : ", or fewer workers (--nproc-per-node)");
    peak_tflops(-1, MATH_FP32, NULL, 0); /* a bad PEAK_TFLOPS, which every worker inherits (no CUDA call) */

    /* --standalone (torchrun's): a job of one node on a port no other job holds — the kernel's pick of
     * a free one. On a machine where several people start jobs, each on the default 29500 would fail
     * but the first. The launcher keeps listening on it and hands the socket to rank 0's store
     * (STAGE_STORE_FD), as torchrun's agent hosts its own store: had it closed the port after the
     * pick, another process could take it before rank 0 listened there. */
    LaunchConfig own = *cfg;
    int store_fd = -1;
    if (cfg->standalone) {
        if (cfg->nnodes > 1)
            die_user("--standalone is a job of one node (torchrun's --standalone): drop it, or --nnodes %d (a job of "
                     "several nodes meets at node 0's --master-addr and --master-port)", cfg->nnodes);
        if (cli_given("master-port"))
            die_user("--standalone picks a free port itself: drop --master-port %d, or --standalone", cfg->master_port);
        int fd = net_listen(cfg->master_addr, 0, &own.master_port);
        /* ENOENT: net_listen's "no such name", not a file's "No such file or directory" */
        if (fd < 0 && (errno == ENOENT || errno == EADDRNOTAVAIL))
            die_user("--standalone: --master-addr %s is %s — drop --master-addr (a job of one node meets on 127.0.0.1), "
                     "or give an address of this machine", cfg->master_addr,
                     errno == ENOENT ? "no host name (it does not resolve)" : "not an address of this machine");
        if (fd < 0)
            die_user("--standalone: no free TCP port on %s (%s) — check --master-addr, or give --master-port instead",
                     cfg->master_addr, errno_string());
        store_fd = fd;
        cfg = &own;
    }

    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) exe[len] = 0;
    else snprintf(exe, sizeof exe, "%s", argv[0]);

    /* The rendezvous secret (auth.h): the user's if given to a job of several nodes (every node needs
     * the same), else a fresh random one that only our own workers get, through their environment —
     * never on the wire. A job of one node is its launcher's workers alone, so it always gets a fresh
     * one: two jobs started from a shell that exported STAGE_RDZV_SECRET shared it, and the second,
     * on the first one's port, joined its rendezvous (claiming its ranks, stopping both). */
    char secret[65] = "";
    uint8_t given[AUTH_MAX_SECRET];
    size_t given_len = cfg->nnodes > 1 ? auth_secret(given, sizeof given) : 0; /* one node: not read, so not refused */
    if (!given_len) {
        if (cfg->nnodes > 1)
            die_user("--nnodes %d: every node's launcher needs the same rendezvous secret — export "
                     "STAGE_RDZV_SECRET=$(openssl rand -hex 32) on one, and the same value on the others "
                     "(or STAGE_RDZV_SECRET_FILE=a file only you can read)", cfg->nnodes);
        auth_new_secret(secret);
    }

    /* Node 0's rank 0 will host the rendezvous store on --master-port. A port that another job
     * holds fails the job confusingly — rank 0 says so, but rank 1 may reach the other job's store
     * and report that store's refusal — so node 0's launcher checks it once, before any worker. */
    if (cfg->node_rank == 0 && store_fd < 0) { /* --standalone holds its port already */
        int fd = net_listen(cfg->master_addr, cfg->master_port, NULL);
        if (fd >= 0) close(fd);
        else if (errno == EADDRINUSE) {
            /* …unless the store there answers to this job's secret: node 0 is running already, and this
             * launcher is another node that was not given its --node-rank (whose default is 0) */
            const char *why;
            int own = given_len ? store_dial(cfg->master_addr, cfg->master_port, given, given_len, 2, &why) : -1;
            if (own >= 0) {
                close(own);
                char ranks[48];
                if (cfg->nnodes > 2) snprintf(ranks, sizeof ranks, "1 … %d", cfg->nnodes - 1);
                else snprintf(ranks, sizeof ranks, "1");
                die_user("%s: node 0 of this job is already running (its rendezvous store on %s:%d answers to this "
                         "job's secret) — give this node its own --node-rank (%s; the default is 0); if that is "
                         "another job of yours with the same secret, pick a free --master-port", prog,
                         cfg->master_addr, cfg->master_port, ranks);
            }
            die_user("%s: --master-port %d on %s is in use (another job, or one still shutting down) — pick a "
                     "free one with --master-port%s", prog, cfg->master_port, cfg->master_addr,
                     cfg->nnodes == 1 ? ", or let --standalone pick one" : "");
        }
    }

    /* The status page: one slot per local worker, inherited as a file descriptor across exec. */
    int status_fd;
    StatusSlot *slots = status_page_create(n, &status_fd);
    page = slots;

    printf("%s: launching %d worker%s on this node (ranks %d-%d of %d, %s, %s), rendezvous at %s:%d%s\n", prog, n,
           n == 1 ? "" : "s", first, first + n - 1, world, cuda ? "GPU" : "CPU",
           comm == COMM_NCCL ? "nccl" : "host ring", cfg->master_addr, cfg->master_port,
           cfg->standalone ? " (a free port: --standalone)" : "");
    fflush(stdout);
    fflush(stderr);

    /* The signals the wait loop reacts to stay blocked except inside sigsuspend: one that arrives
     * between the loop's check of got_signal and its wait stays pending and ends that wait at once,
     * instead of being noticed only when some worker exits. The workers get the old mask back. */
    struct sigaction sa = {.sa_sigaction = on_signal, .sa_flags = SA_SIGINFO}, tstp = {.sa_handler = on_tstp}, was;
    sigemptyset(&sa.sa_mask), sigemptyset(&tstp.sa_mask);
    const int stops[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    for (int i = 0; i < 4; i++) /* one ignored by whoever started us (a script's `cmd &`, nohup) stays */
        if (sigaction(stops[i], NULL, &was) == 0 && was.sa_handler != SIG_IGN) /* ignored, in the workers too */
            sigaction(stops[i], &sa, NULL);
    if (sigaction(SIGTSTP, NULL, &was) == 0 && was.sa_handler != SIG_IGN) {
        struct sigaction cont = {.sa_handler = on_cont};
        sigemptyset(&cont.sa_mask);
        sigaction(SIGTSTP, &tstp, NULL);
        sigaction(SIGCONT, &cont, NULL); /* a `fg` that comes before we stop ourselves: then we do not */
    }
    sigset_t watched, old_mask, waiting;
    sigemptyset(&watched);
    sigaddset(&watched, SIGINT), sigaddset(&watched, SIGTERM), sigaddset(&watched, SIGHUP), sigaddset(&watched, SIGQUIT);
    sigaddset(&watched, SIGCHLD), sigaddset(&watched, SIGTSTP);
    sigprocmask(SIG_BLOCK, &watched, &old_mask);
    waiting = old_mask;
    sigdelset(&waiting, SIGINT), sigdelset(&waiting, SIGTERM), sigdelset(&waiting, SIGHUP), sigdelset(&waiting, SIGQUIT);
    sigdelset(&waiting, SIGCHLD), sigdelset(&waiting, SIGTSTP);

    pid_t self = getpid();
    Child *ch = xcalloc((size_t)n, sizeof *ch);
    for (int i = 0; i < n; i++) {
        ch[i].rank = first + i, ch[i].local_rank = i;
        pid_t pid = fork();
        if (pid < 0) { /* out of processes or memory: stop the ones already started, name the fix */
            int e = errno;
            stop_all(ch, i);
            die_user("%s launcher: cannot start worker %d of %d: %s — lower --nproc-per-node, or raise the "
                     "process limit (ulimit -u) or free memory", prog, i + 1, n, strerror(e));
        }
        if (pid == 0) {
            /* Die with the launcher, whatever kills it (even SIGKILL): no orphaned workers. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != self) _exit(1);
            /* A session of its own, as torchrun starts its workers: a terminal's Ctrl-C (sent to the
             * foreground process group) reaches the launcher alone, which passes it on once below.
             * Had the workers received it too, the launcher's copy would be their second signal —
             * which stops a saving run at once, unsaved (stop.h). */
            setsid();
            sigprocmask(SIG_SETMASK, &old_mask, NULL);
            set_env_int("RANK", first + i);
            set_env_int("LOCAL_RANK", i);
            set_env_int("WORLD_SIZE", world);
            set_env_int("LOCAL_WORLD_SIZE", n);
            set_env_int("GROUP_RANK", cfg->node_rank);
            setenv("MASTER_ADDR", cfg->master_addr, 1);
            set_env_int("MASTER_PORT", cfg->master_port);
            set_env_int("STAGE3_STATUS_FD", status_fd);
            unsetenv("STAGE_STORE_FD"); /* rank 0 alone gets the socket; close-on-exec shuts the others' copy */
            if (store_fd >= 0 && first + i == 0 && fcntl(store_fd, F_SETFD, 0) == 0)
                set_env_int("STAGE_STORE_FD", store_fd);
            unsetenv("TORCHELASTIC_USE_AGENT_STORE");
            if (secret[0]) setenv("STAGE_RDZV_SECRET", secret, 1), unsetenv("STAGE_RDZV_SECRET_FILE");
            execv(exe, argv);
            fprintf(stderr, "error: %s launcher: cannot exec %s: %s\n", prog, exe, strerror(errno));
            _exit(127);
        }
        ch[i].pid = pid;
    }
    close(status_fd);
    if (store_fd >= 0) close(store_fd); /* rank 0 holds it now */

    /* Wait. The first worker to fail (or a signal to us) stops everyone. */
    int alive = n, failure = 0;
    while (alive > 0 && !failure && !got_signal) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG | WUNTRACED | WCONTINUED); /* stops too: a stopped rank is blamed */
        if (pid == 0) { /* nothing yet: sleep until a worker changes state or a signal comes */
            sigsuspend(&waiting);
            if (got_tstp) pause_with_workers(ch, n);
            continue;
        }
        if (pid < 0) {
            if (errno == EINTR) continue;
            /* ECHILD with workers unaccounted for: something else reaped them. Never call that success. */
            stop_all(ch, n);
            die_user("%s launcher: lost track of %d worker%s (waitpid: %s) — was the launcher started by a "
                     "program that reaps its children? Run it directly", prog, unreaped(ch, n),
                     unreaped(ch, n) == 1 ? "" : "s", strerror(errno));
        }
        reap(ch, n, pid, st);
        if (WIFSTOPPED(st) || WIFCONTINUED(st)) continue;
        alive--;
        for (int i = 0; i < n; i++) failure |= ch[i].pid == pid && failed(&ch[i]) && !stopped_clean(&ch[i], &slots[i]);
    }
    if (!failure && !got_signal) {
        int sig = 0; /* every worker exited 0, or stopped cleanly for a signal one of them was sent */
        for (int i = 0; i < n; i++) sig = stopped_clean(&ch[i], &slots[i]) ? WEXITSTATUS(ch[i].status) - 128 : sig;
        if (!sig) exit(0);
        fprintf(stderr, "%s: every worker stopped early for a SIG%s, at the same step (saved: see rank 0's lines)\n",
                prog, status_signal_name(sig));
        exit(128 + sig);
    }

    if (got_signal && !failure) { /* Ctrl-C or a kill: pass it on, and give a saving run time to stop cleanly */
        int sig = got_signal;
        failure = pass_signal_on(ch, n, sig);
        int clean = 0, done = 0;
        for (int i = 0; i < n; i++)
            clean += stopped_clean(&ch[i], &slots[i]),
            done += ch[i].reaped && WIFEXITED(ch[i].status) && !WEXITSTATUS(ch[i].status);
        if (done == n) exit(0); /* it came at the run's last step: the run finished */
        if (!failure) {
            if (clean == n)
                fprintf(stderr, "%s: interrupted by SIG%s: every worker stopped after the same step (saved: see rank "
                        "0's lines)\n", prog, status_signal_name(sig));
            else
                fprintf(stderr, "%s: interrupted by SIG%s: stopped %s %d worker%s\n", prog, status_signal_name(sig),
                        n == 1 ? "its" : "all", n, n == 1 ? "" : "s");
            exit(128 + sig);
        }
    }
    /* A failure: say so at once, then stop the others. A worker that is stopped (SIGSTOP) when the
     * others fail is the cause: they timed out waiting for it. */
    int stopped_root = -1;
    for (int i = 0; i < n && stopped_root < 0; i++)
        if (ch[i].sigstopped && !ch[i].reaped) stopped_root = i;
    /* Workers that fail together (the same bad flag in every rank) exit within milliseconds of each
     * other: collect those for up to 0.1 s — and up to 2 s for one that has called exit() but is still
     * tearing down (a GPU context takes a while), or while every failure so far is collateral (the
     * rank that caused it is still on its way out) — so both lines below name the same first failure.
     * One that chose to exit before the failure seen so far may be the first: it is waited for as long
     * as stop_all would wait before its SIGKILL (it gets no SIGTERM), LAUNCH_GRACE_S. */
    for (int64_t t0 = status_clock_ns();;) {
        int st, exiting = 0, earlier = 0;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            reap(ch, n, pid, st);
            continue;
        }
        for (int i = 0; i < n; i++) exiting += !ch[i].reaped && __atomic_load_n(&slots[i].exit_ns, __ATOMIC_RELAXED);
        int root = first_failure(ch, slots, n);
        int known = stopped_root >= 0 || (root >= 0 && !__atomic_load_n(&slots[root].collateral, __ATOMIC_RELAXED));
        for (int i = 0; i < n && root >= 0 && stopped_root < 0; i++) {
            int64_t t = ch[i].reaped ? 0 : __atomic_load_n(&slots[i].exit_ns, __ATOMIC_RELAXED);
            earlier += t && t < failure_ns(&ch[root], &slots[root]);
        }
        int64_t waited = status_clock_ns() - t0, most = earlier ? (int64_t)(LAUNCH_GRACE_S * 1e9) : 2000000000;
        if (pid < 0 || !unreaped(ch, n) || waited > most || (waited > 100000000 && !exiting && known)) break;
        usleep(2000);
    }
    char msg[256];
    int seen = stopped_root >= 0 ? stopped_root : first_failure(ch, slots, n);
    if (seen >= 0 && died_of_closed_output(&ch[seen])) { /* `| head` ended: no failure to hunt for */
        stop_all(ch, n);
        fprintf(stderr, "%s: stopped %s %d worker%s: rank %d's output was closed (SIGPIPE; its line above says "
                        "what to do)\n", prog, n == 1 ? "its" : "all", n, n == 1 ? "" : "s", ch[seen].rank);
        exit(128 + SIGPIPE);
    }
    if (seen >= 0 && unreaped(ch, n)) {
        describe_exit(&ch[seen], &slots[seen], msg, sizeof msg);
        int itself = !ch[seen].reaped, others = unreaped(ch, n) - itself; /* a stopped root is stopped too */
        fprintf(stderr, "%s: %s — stopping %s (SIGTERM, SIGKILL after %.0f s)\n", prog, msg,
                !itself ? "the other workers" : others ? "it and the other workers" : "it", LAUNCH_GRACE_S);
    }
    stop_all(ch, n);
    int root = stopped_root >= 0 ? stopped_root : first_failure(ch, slots, n);
    if (root < 0) root = 0;
    /* The others (never the root, which a stopped root is to our SIGTERM too): stopped = ended by our
     * SIGTERM/SIGKILL; failed after it = exited with an error on their own meanwhile (the same error,
     * or a peer's loss noticed: see their lines). */
    int stopped = 0, after = 0;
    for (int i = 0; i < n; i++)
        if (i != root) stopped += killed_by_us(&ch[i]), after += !killed_by_us(&ch[i]) && failed(&ch[i]);
    describe_exit(&ch[root], &slots[root], msg, sizeof msg);
    char others[96] = "";
    if (stopped) snprintf(others, sizeof others, "; %d other worker%s stopped", stopped, stopped == 1 ? "" : "s");
    if (after)
        snprintf(others + strlen(others), sizeof others - strlen(others), "; %d other worker%s failed too",
                 after, after == 1 ? "" : "s");
    fprintf(stderr, "%s: job failed: %s (first failure)%s\n", prog, msg, others);
    if (!killed_by_us(&ch[root]) && !ch[root].sigstopped && !exiting_when_stopped(&ch[root]) &&
        WIFSIGNALED(ch[root].status)) {
        /* a signal the worker raised on purpose has a known cause: no guess at another */
        if (__atomic_load_n(&slots[root].on_purpose, __ATOMIC_RELAXED) == WTERMSIG(ch[root].status))
            fprintf(stderr, "  note: STAGE3_FAIL_AT (test-only) made it raise this signal — unset it to train\n");
        else if (WTERMSIG(ch[root].status) == SIGKILL)
            fprintf(stderr, "  hint: a SIGKILL this launcher did not send is most often the kernel's out-of-memory "
                            "killer (dmesg says so): lower --batch-size or --train-size, or run fewer workers on "
                            "this host\n");
    }
    /* The root's own code, or 128 + its signal; 1 for a stopped root, whose SIGTERM was ours (143 would
     * say one came from outside), and for one our SIGKILL ended inside its exit (its code is lost). */
    int code = killed_by_us(&ch[root]) || (WIFSIGNALED(ch[root].status) && exiting_when_stopped(&ch[root])) ? 1
               : WIFEXITED(ch[root].status) ? WEXITSTATUS(ch[root].status)
                                            : 128 + WTERMSIG(ch[root].status);
    exit(code ? code : 1);
}

void launch_or_join(int argc, char **argv, const LaunchConfig *cfg, Worker *w) {
    (void)argc;
    check_master_addr(cfg->master_addr, NULL);
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    if (!strncmp(base, "stage", 5)) snprintf(prog, sizeof prog, "%s", base);
    if (!worker_from_env(cfg, w)) launcher_run(argv, cfg);
    cpu_threads_share(w->local_world_size); /* the workers on this host share its cores */
    if (w->local_rank > 0) cpu_threads_quiet(); /* local rank 0 warns about OMP_NUM_THREADS for them all */
    status_attach(env_int("STAGE3_STATUS_FD", -1), w->local_rank, w->rank);
}
