/*
 * django-taskclaim's claim / lease / heartbeat / fence / settle / reap protocol, for Spin.
 *
 * One atomic step is one statement the code sends (or one in-memory step of a worker
 * thread). docs/protocol.md explains the model; protocol/actions.json ties each action
 * (the labels starting with A and an underscore in the comments) to the function and the
 * statement that implement it; protocol/check.py runs every check.
 *
 * Bounds (override with spin -D...): W workers (at most 3), R rows (at most 2), lease L
 * ticks, MAXATT attempts, tokens up to TOKMAX (so about TOKMAX/2 claims per row), CRASHES
 * worker kills, STALLS worker pauses, one operator row lock, one cancel, one requeue.
 *
 * Broken designs, each of which Spin must reject (spin -DWITNESS_...):
 *   SILENCE      a reaper that takes the rows of a worker whose registry fell silent
 *   UNFENCED     every write of a worker (outcome, release, the fenced block's lock)
 *                WHERE id = ... only
 *   UNFENCED_COMPLETE the plain completion / retry / fail written WHERE id = ... only
 *   UNFENCED_BATCH    the batched completion written WHERE id = ... only
 *   REAP_EARLY   a reaper that takes a row one tick before its lease ends
 *   REAP_ANYTIME a reaper that takes processing rows whatever their lease
 *   READBACK_PK  a compare-and-set claim whose read-back is by primary key only
 *   HB_ACKS      a heartbeat that writes the buffered completions itself, waiting on locks
 *   REAP_NORECHECK a reaper that selects expired rows, then updates them by id only
 *   SUP_PAUSED   a supervisor that releases the rows of a child that stopped answering
 *                (paused), without having seen it exit
 */

#ifndef W
#define W 3
#endif
#ifndef R
#define R 1
#endif
#ifndef L
#define L 3
#endif
#ifndef MAXATT
#define MAXATT 2
#endif
#ifndef TOKMAX
#define TOKMAX 6  /* token bound: about TOKMAX/2 claims per row */
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef STALLS
#define STALLS 1
#endif
#define SILENT 2  /* registry silence threshold in ticks, shorter than the lease */
#define MARGIN 1  /* the watch tells a body one interval (one tick) before its lease lapses */

/* row status */
#define READY 0
#define PROC 1
#define DONE 2
#define FAILED 3
#define CANC 4

/* a worker's view of one row (its ledger) */
#define NONE 0
#define CLAIMED 1   /* claimed, body not started */
#define RUNNING 2   /* body running */
#define LOCKED 3    /* atomic form: inside fenced(complete=True), row lock held */
#define ACKED 5     /* completion deferred to the ack buffer */

#define OP (W + 1)  /* the operator's session id in lockby */

/* ---- the database --------------------------------------------------------------- */
byte st[R];       /* status */
byte tok[R];      /* claim token (version) */
short left[R];    /* locked_until - now, in ticks; -1 = lapsed (or none) */
byte holder[R];   /* locked_by */
byte att[R];      /* attempts */
byte lockby[R];   /* 0 = no row lock; w+1 = a transaction of worker w; OP = operator */

/* ---- ghosts (bookkeeping for the properties, not in the database) --------------- */
byte effect[R];   /* committed effects of atomic-form bodies */
short ghost[R];   /* lease left of an earlier attempt taken without proof; -1: none */
bool wasstalled[W];

/* ---- the workers: index w*R + r ------------------------------------------------- */
byte mt[W * R];   /* token the worker holds */
byte ph[W * R];   /* ledger phase */
bool fl[W * R];   /* cancellation flag */
bool af[W * R];   /* this attempt uses the atomic form (ClaimMeta.atomic) */
bool alive[W];
bool exited[W];   /* the process exited; its supervisor has not reaped it yet */
bool due[W];      /* a heartbeat interval passed since the last beat */
bool hbstall[W];  /* the process is paused (SIGSTOP, GC, VM steal) */
#ifdef WITNESS_SILENCE
byte reg[W];      /* ticks since the registry was touched */
#endif
byte cstep[W];    /* claimer: 0 idle, 1 candidate read, 2 claimed, read-back due */
byte crow[W];
byte cseen[W];
#ifdef WITNESS_REAP_NORECHECK
bool picked[R];
#endif

byte crashes, stalls, oplocks, opcancels, opreqs;

#define I(w, r) ((w) * R + (r))
#define MAX(a, b) ((a) > (b) -> (a) : (b))

/* ONE HOLDER: never two bodies of one row running with valid claims. A claim is valid
 * while its token is the row's, the row is processing and its lease has not lapsed. */
#define VALIDRUN(w, r) ((w) < W && (ph[I(w, r)] == RUNNING || ph[I(w, r)] == LOCKED) \
    && mt[I(w, r)] == tok[r] && st[r] == PROC && left[r] >= 0)
#define ONE_HOLDER(r) (VALIDRUN(0, r) + VALIDRUN(1, r) + VALIDRUN(2, r) + VALIDRUN(3, r) <= 1)
#if R > 1
#define ONE_HOLDER_ALL (ONE_HOLDER(0) && ONE_HOLDER(1))
#else
#define ONE_HOLDER_ALL (ONE_HOLDER(0))
#endif

active proctype OneHolder() {
  atomic { !ONE_HOLDER_ALL -> assert(false) }  /* A property: ONE HOLDER */
}

#ifdef WITNESS_UNFENCED
#define FENCE(w, r) (true)
#else
#define FENCE(w, r) (mt[I(w, r)] == tok[r] && st[r] == PROC)
#endif
#ifdef WITNESS_UNFENCED_COMPLETE
#define FENCE_OUTCOME(w, r) (true)
#else
#define FENCE_OUTCOME(w, r) FENCE(w, r)
#endif
#ifdef WITNESS_UNFENCED_BATCH
#define FENCE_BATCH(w, r) (true)
#else
#define FENCE_BATCH(w, r) FENCE(w, r)
#endif

/* The row leaves processing for good or for a new claim: the lease is over. */
inline settle_row(r, to) {
  st[r] = to;
  tok[r]++;
  left[r] = -1;
  holder[r] = 0
}

/* A worker forgets a row (values reset so that equal states compare equal). */
inline forget(i) {
  ph[i] = NONE; mt[i] = 0; fl[i] = 0; af[i] = 0
}

/* Taken from its holder without proof of death: that attempt's lease lives on. Recorded
 * by every step that takes a processing row from a holder it has not seen die (the
 * reaper, a supervisor's release of a child it did not see exit), whatever its guard:
 * a row taken once its lease has lapsed leaves no lease behind (left < 0). */
inline take_unproven(r) {
  if
  :: st[r] == PROC -> ghost[r] = MAX(ghost[r], left[r])
  :: else -> skip
  fi
}

/* A worker's write of the row's status (outcome, release, batched completion). FENCED is
 * observed here, in the write itself, not beside the condition that guards it: a write
 * lands only with the row's current token, on a processing row. */
inline write_row(w, r, to) {
  assert(mt[I(w, r)] == tok[r] && st[r] == PROC);  /* FENCED */
  settle_row(r, to)
}

/* ---- a worker ------------------------------------------------------------------- */

/* A_claim: compare-and-set. The candidate read and the UPDATE are one step here: a
 * candidate that went stale makes the UPDATE (WHERE version = seen AND ready) hit nothing,
 * which is the same as not claiming. The read-back is a step of its own. */
inline claim(w, r) {
  atomic {
    (alive[w] && cstep[w] == 0 && ph[I(w, r)] == NONE && st[r] == READY && tok[r] < TOKMAX
     && lockby[r] == 0) ->
    st[r] = PROC; tok[r]++; att[r]++; left[r] = L; holder[r] = w;
#ifdef CLAIM_ONE_STATEMENT
    mt[I(w, r)] = tok[r]; ph[I(w, r)] = CLAIMED
#else
    cseen[w] = tok[r]; crow[w] = r; cstep[w] = 2
#endif
  }
}

inline give_back(w, r) {
  atomic { /* A_release: give an unstarted row back, fenced (attempt not counted) */
    alive[w] && ph[I(w, r)] == CLAIMED && lockby[r] == 0 ->
    if
    :: FENCE(w, r) -> att[r]--; write_row(w, r, READY)
    :: else -> skip
    fi;
    forget(I(w, r))
  }
}

proctype Claimer(byte w) {
  byte r;
  do
  :: claim(w, 0)
#if R > 1
  :: claim(w, 1)
#endif
  :: atomic { /* A_readback: SELECT ... WHERE pk AND version = won AND processing */
       alive[w] && cstep[w] == 2 ->
       r = crow[w];
#ifdef WITNESS_READBACK_PK
       mt[I(w, r)] = tok[r]; ph[I(w, r)] = CLAIMED;
#else
       if
       :: tok[r] == cseen[w] && st[r] == PROC -> mt[I(w, r)] = tok[r]; ph[I(w, r)] = CLAIMED
       :: else -> skip  /* taken over in between: left out */
       fi;
#endif
       cstep[w] = 0; cseen[w] = 0; crow[w] = 0; r = 0
     }
  :: give_back(w, 0)
#if R > 1
  :: give_back(w, 1)
#endif
  od
}

inline start(w, r) {
  atomic { /* A_start: the executor takes a claimed row */
    alive[w] && ph[I(w, r)] == CLAIMED ->
    if
    :: fl[I(w, r)] -> forget(I(w, r))  /* told to stop before it started: never started */
    :: else ->
       assert(ghost[r] < 0);  /* NO EARLY RE-RUN */
       ph[I(w, r)] = RUNNING;
       if
       :: af[I(w, r)] = 1
       :: af[I(w, r)] = 0
       fi
    fi
  }
}

inline body(w, r) {
  if
  :: atomic { /* A_lock_claim: fenced(): a no-op UPDATE fenced on the token takes the row lock */
       alive[w] && ph[I(w, r)] == RUNNING && af[I(w, r)] && lockby[r] == 0 ->
       if
       :: FENCE(w, r) -> lockby[r] = w + 1; ph[I(w, r)] = LOCKED
       :: else -> forget(I(w, r))  /* ClaimLost: the block does not run */
       fi
     }
  :: atomic { /* A_atomic_complete: effect and completion commit together */
       alive[w] && ph[I(w, r)] == LOCKED ->
       write_row(w, r, DONE);
       effect[r]++;
       assert(effect[r] <= 1);  /* EXACTLY ONCE */
       lockby[r] = 0; forget(I(w, r))
     }
  :: atomic { /* A_complete / A_retry / A_fail: the body returned (whatever its flag
               * said); one fenced UPDATE, which waits for a row lock */
       alive[w] && ph[I(w, r)] == RUNNING && !af[I(w, r)] && lockby[r] == 0 ->
       if
       :: FENCE_OUTCOME(w, r) ->
          if
          :: write_row(w, r, DONE)
          :: att[r] < MAXATT -> write_row(w, r, READY)
          :: else -> write_row(w, r, FAILED)  /* Fail(), or the last attempt's retry */
          fi
       :: else -> skip  /* ClaimLost */
       fi;
       forget(I(w, r))
     }
  :: atomic { /* A_defer: the body returned; its completion goes to the ack buffer */
       alive[w] && ph[I(w, r)] == RUNNING && !af[I(w, r)] && !fl[I(w, r)] -> ph[I(w, r)] = ACKED
     }
  fi
}

proctype Executor(byte w) {
  do
  :: start(w, 0)
  :: body(w, 0)
#if R > 1
  :: start(w, 1)
  :: body(w, 1)
#endif
  od
}

#define ACKS(w) (ph[I(w, 0)] == ACKED || (R > 1 && ph[I(w, R - 1)] == ACKED))
#define ACKS_LOCKED(w) ((ph[I(w, 0)] == ACKED && lockby[0] != 0) \
    || (R > 1 && ph[I(w, R - 1)] == ACKED && lockby[R - 1] != 0))

/* A_complete_many: one UPDATE for the whole buffer, fenced row by row. */
inline write_acks(w) {  /* needs a local byte a */
  for (a : 0 .. R - 1) {
    if
    :: ph[I(w, a)] == ACKED ->
       if
       :: FENCE_BATCH(w, a) -> write_row(w, a, DONE)
       :: else -> skip
       fi;
       forget(I(w, a))
    :: else -> skip
    fi
  }
  a = 0
}

proctype AckWriter(byte w) {
  byte a;
  do
  :: atomic { alive[w] && ACKS(w) && !ACKS_LOCKED(w) -> write_acks(w) }
  od
}

#ifdef WITNESS_HB_ACKS
#define HB_BLOCKED(w) (ACKS(w) && ACKS_LOCKED(w))
#else
#define HB_BLOCKED(w) (false)
#endif

/* rows whose lease the heartbeat keeps: claimed, running (not the atomic form: its own
 * transaction holds the row lock), finished with the outcome pending */
#define HELD(i) (ph[i] == CLAIMED || (ph[i] == RUNNING && !af[i]) || ph[i] == ACKED)
/* rows a lapsing lease must stop: claimed or running, not finishing */
#define STARTABLE(i) (ph[i] == CLAIMED || (ph[i] == RUNNING && !af[i]))

proctype Heartbeat(byte w) {
  byte r, a;
  do
  :: atomic { /* A_renew: SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE ... fenced */
       alive[w] && due[w] && !hbstall[w] && !HB_BLOCKED(w) ->
#ifdef WITNESS_HB_ACKS
       write_acks(w);
#endif
       for (r : 0 .. R - 1) {
         if
         :: HELD(I(w, r)) ->
            if
            :: lockby[r] != 0 && lockby[r] != w + 1 -> skip  /* busy: skipped, never waited for */
            :: else ->
               if
               :: mt[I(w, r)] == tok[r] && st[r] == PROC -> left[r] = L
               :: else ->  /* A_mark_lost: lost; unstarted: dropped, running: told */
                  if
                  :: ph[I(w, r)] == CLAIMED -> forget(I(w, r))
                  :: else -> fl[I(w, r)] = 1
                  fi
               fi
            fi
         :: else -> skip
         fi;
         /* A_watch: one interval before the lease could lapse, tell the body */
         if
         :: (STARTABLE(I(w, r)) && mt[I(w, r)] == tok[r] && st[r] == PROC
             && left[r] <= MARGIN) -> fl[I(w, r)] = 1
         :: else -> skip
         fi
       }
#ifdef WITNESS_SILENCE
       reg[w] = 0;
#endif
       due[w] = 0; r = 0
     }
  od
}

/* ---- time: one tick = one heartbeat interval ------------------------------------ */
/* A tick waits for every live heartbeat that is not paused to have beaten (timely
 * threads; a heartbeat blocked on a lock does not stop time), and for a claim between
 * its UPDATE and its read-back (one round trip). */
#define TIMELY(w) ((w) >= W || !alive[w] || hbstall[w] || ((!due[w] || HB_BLOCKED(w)) \
    && cstep[w] != 2))

/* RENEWALS NEVER WAIT: a lease held by a live worker that was never paused does not
 * lapse before the body under it was told (cancellation flag). */
#define TOLD(w, r) ((w) >= W || !alive[w] || wasstalled[w] || mt[I(w, r)] != tok[r] \
    || !STARTABLE(I(w, r)) || fl[I(w, r)])

active proctype Clock() {
  byte r, w;
  do
  :: atomic { /* A_tick: the database clock moves one heartbeat interval */
       TIMELY(0) && TIMELY(1) && TIMELY(2) && TIMELY(3) ->
       for (r : 0 .. R - 1) {
         if
         :: st[r] == PROC && left[r] >= 0 ->
            if
            :: left[r] == 0 -> assert(TOLD(0, r) && TOLD(1, r) && TOLD(2, r) && TOLD(3, r))
            :: else -> skip
            fi;
            left[r]--
         :: else -> skip
         fi;
         if
         :: ghost[r] >= 0 -> ghost[r]--
         :: else -> skip
         fi
       }
       for (w : 0 .. W - 1) {
         if
         :: alive[w] -> due[w] = 1
         :: else -> skip
         fi;
#ifdef WITNESS_SILENCE
         if
         :: reg[w] < SILENT -> reg[w]++
         :: else -> skip
         fi
#endif
       }
       r = 0; w = 0
     }
  od
}

/* ---- recovery ------------------------------------------------------------------- */
/* The reaper's rule: the lease has lapsed on the database clock. */
#if defined(WITNESS_REAP_ANYTIME)
#define LAPSED(r) (true)
#elif defined(WITNESS_REAP_EARLY)
#define LAPSED(r) (left[r] < 1)
#else
#define LAPSED(r) (left[r] < 0)
#endif

inline reap_row(r) {
  if
  :: att[r] >= MAXATT -> settle_row(r, FAILED)
  :: else -> settle_row(r, READY)
  fi
}

/* Every form of the reaper's UPDATE goes through here: the rows it takes are recorded
 * (take_unproven), so that a reaper which takes a lease still running is seen. */
inline reaper_takes(r) {
  take_unproven(r);
  reap_row(r)
}

inline reap(r) {
  if
#ifdef WITNESS_REAP_NORECHECK
  :: atomic { /* SELECT the expired rows */
       st[r] == PROC && LAPSED(r) && !picked[r] -> picked[r] = 1
     }
  :: atomic { /* UPDATE ... WHERE pk IN (...) only */
       picked[r] && lockby[r] == 0 -> reaper_takes(r); picked[r] = 0
     }
#else
  :: atomic { /* A_reap: UPDATE ... WHERE processing AND locked_until < now() */
       st[r] == PROC && LAPSED(r) && lockby[r] == 0 -> reaper_takes(r)
     }
#endif
#ifdef WITNESS_SILENCE
  :: atomic { /* registry silence taken as death */
       st[r] == PROC && reg[holder[r]] >= SILENT && lockby[r] == 0 ->
       reaper_takes(r)
     }
#endif
  fi
}

active proctype Reaper() {
  do
  :: reap(0)
#if R > 1
  :: reap(1)
#endif
  od
}

/* A_release_worker: rows of a worker proven dead, fenced on holder and status. A
 * release of a child that was not seen to exit takes its rows without proof. */
inline release_worker(w) {  /* needs a local byte q */
  for (q : 0 .. R - 1) {
    if
    :: st[q] == PROC && holder[q] == w ->
       if
       :: !exited[w] -> take_unproven(q)
       :: else -> skip
       fi;
       reap_row(q)
    :: else -> skip
    fi
  }
  q = 0
}

#define HOLDS_LOCKED(w) ((st[0] == PROC && holder[0] == w && lockby[0] != 0) \
    || (R > 1 && st[R - 1] == PROC && holder[R - 1] == w && lockby[R - 1] != 0))

inline supervise(w) {
  if
  :: atomic { /* A_waitpid: the child exited: release its rows, then restart it */
    w < W && exited[w] && !HOLDS_LOCKED(w) ->
    release_worker(w); exited[w] = 0; alive[w] = 1; due[w] = 0
  }
#ifdef WITNESS_SUP_PAUSED
  :: atomic { /* the child stopped answering: taken for dead while it is paused */
    w < W && alive[w] && hbstall[w] && !HOLDS_LOCKED(w) -> release_worker(w)
  }
#endif
  fi
}

active proctype Supervisor() {
  byte q;
  do
  :: supervise(0)
  :: supervise(1)
  :: supervise(2)
  od
}

/* ---- faults --------------------------------------------------------------------- */
inline kill(w) {
  atomic { /* A_kill: SIGKILL; every thread stops, open transactions roll back */
    w < W && alive[w] && crashes < CRASHES ->
    crashes++; alive[w] = 0; exited[w] = 1; hbstall[w] = 0; due[w] = 0;
    cstep[w] = 0; cseen[w] = 0; crow[w] = 0;
    for (k : 0 .. R - 1) {
      forget(I(w, k));
      if
      :: lockby[k] == w + 1 -> lockby[k] = 0
      :: else -> skip
      fi
    }
    k = 0
  }
}

inline pause(w) {
  atomic { /* A_pause: SIGSTOP, a long GC pause; the heartbeat stops beating */
    w < W && alive[w] && !hbstall[w] && stalls < STALLS ->
    stalls++; hbstall[w] = 1; wasstalled[w] = 1
  }
}

/* The workers run the same code from the same state, so which worker a fault hits is
 * chosen up to symmetry: the kill hits worker 0, the pause worker 0 or worker 1. */
active proctype Faults() {
  byte k;
  do
  :: kill(0)
  :: pause(0)
  :: pause(1)
  :: atomic { hbstall[0] -> hbstall[0] = 0 }
  :: atomic { W > 1 && hbstall[1] -> hbstall[1] = 0 }
  od
}

/* ---- the operator (admin actions, a web request's SELECT ... FOR UPDATE) -------- */
inline operate(r) {
  if
  :: atomic { /* A_select_for_update: a web request locks the row */
    lockby[r] == 0 && oplocks < 1 -> oplocks++; lockby[r] = OP
  }
  :: atomic { lockby[r] == OP -> lockby[r] = 0 }
  :: atomic { /* A_cancel: ready or processing -> cancelled, token bumped */
    opcancels < 1 && (st[r] == READY || st[r] == PROC) && (lockby[r] == 0 || lockby[r] == OP) ->
    opcancels++; settle_row(r, CANC)
  }
  :: atomic { /* A_requeue: failed or cancelled -> ready, attempts reset */
    opreqs < 1 && (st[r] == FAILED || st[r] == CANC) && (lockby[r] == 0 || lockby[r] == OP) ->
    opreqs++; att[r] = 0; settle_row(r, READY)
  }
  fi
}

active proctype Operator() {
  do
  :: operate(0)
#if R > 1
  :: operate(1)
#endif
  od
}

init {
  byte w, r;
  atomic {
    for (r : 0 .. R - 1) {
      st[r] = READY; tok[r] = 1; left[r] = -1; ghost[r] = -1
    }
    for (w : 0 .. W - 1) {
      alive[w] = 1;
      run Claimer(w);
      run Executor(w);
      run Heartbeat(w);
#ifndef WITNESS_HB_ACKS
      run AckWriter(w)
#endif
    }
  }
}

#ifdef NOLOSS
/* NO LOSS: no row stays processing for ever (it ends, or is claimable again) */
#if R > 1
ltl noloss { [] <> (st[0] != PROC) && [] <> (st[R - 1] != PROC) }
#else
ltl noloss { [] <> (st[0] != PROC) }
#endif
#endif
