/*
 * The fan-in of django-taskclaim (docs/workflows.md, "Fan-out / fan-in"), checked by Spin.
 *
 * M members, one callback row waiting for all of them (a row created after= the
 * members). Each member's final settle is one transaction: under the lock of the
 * callback's counter row (TaskFanIn), it closes the member's edge if it is still open,
 * decrements the counter, and, when the counter reaches zero, releases the callback
 * (waiting -> ready). A settle transaction may roll back (a worker killed before its
 * commit, a deadlock): nothing of it happened, and the member is settled again later.
 * With REQUEUE, an operator requeues a member that ended, and it settles a second time.
 *
 * Properties (each an assertion in the step that would break it):
 *   CALLBACK ONCE  the callback is released at most once          (released <= 1)
 *   NEVER EARLY    it is released only once every member's settle committed (nsettled == M)
 *   NEVER STUCK    when every member has settled, it has been released   (released == 1)
 *
 * Broken designs, each a -D flag (protocol/check.py runs them; each must be rejected):
 *   WITNESS_OUTSIDE    the counter is decremented and read after the settle committed, in
 *                      statements of their own (an atomic UPDATE, then a read): two
 *                      members that settle together both read zero (the chord that fires
 *                      twice)
 *   WITNESS_UNGUARDED  the settle decrements whether or not the member's edge is still
 *                      open: a member requeued and settled again counts twice
 */

#ifndef M
#define M 3
#endif

byte counter = M;        /* TaskFanIn.open */
bit edge_open[M];        /* TaskDependency.outcome == '' */
bit settled[M];          /* the member's final settle committed (once at least) */
byte nsettled = 0;       /* members whose final settle committed */
byte released = 0;       /* waiting -> ready of the callback */
byte finished = 0;       /* members whose process ended */

inline release() {
    assert(nsettled == M);   /* NEVER EARLY */
    released++;
    assert(released <= 1);   /* CALLBACK ONCE */
}

inline commit_member(i) {
    if
    :: !settled[i] -> settled[i] = 1; nsettled++
    :: else -> skip
    fi
}

inline settle(i) {
    /* The settle transaction; it may roll back as a whole first (at most once). */
    if
    :: aborts < 1 -> aborts++   /* rolled back: nothing written; settled again below */
    :: true ->
#ifdef WITNESS_OUTSIDE
        atomic { commit_member(i); edge_open[i] = 0 }
        counter--;                                  /* UPDATE open = open - 1, own statement */
        if
        :: counter == 0 -> atomic { release() }     /* read afterwards: zero? release */
        :: else -> skip
        fi;
        done_settle = 1
#else
        atomic {   /* one transaction, under the counter row's lock */
            commit_member(i);
#ifdef WITNESS_UNGUARDED
            edge_open[i] = 0;
            counter--;
            if
            :: counter == 0 -> release()
            :: else -> skip
            fi;
#else
            if
            :: edge_open[i] ->                       /* this settle closes the edge */
                edge_open[i] = 0;
                counter--;
                if
                :: counter == 0 -> release()
                :: else -> skip
                fi
            :: else -> skip                          /* closed already: counted once */
            fi;
#endif
            done_settle = 1
        }
#endif
    fi
}

proctype Member(byte i) {
    byte aborts = 0;
    bit done_settle = 0;
    byte rounds = 0;
again:
    done_settle = 0;
    do
    :: done_settle -> break
    :: !done_settle -> settle(i)
    od;
#ifdef REQUEUE
    if
    :: rounds < 1 && i == 0 -> rounds++; aborts = 1; goto again   /* requeued: settles again */
    :: true -> skip
    fi;
#endif
    finished++
}

init {
    byte k = 0;
    atomic {
        do
        :: k < M -> edge_open[k] = 1; run Member(k); k++
        :: k == M -> break
        od
    }
    finished == M;
    assert(released == 1);   /* NEVER STUCK */
}
