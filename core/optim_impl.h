/* core/optim_impl.h: the optimizer's layout, shared by core/optim.c (the updates, clipping,
 * schedules) and core/optim_state.c (its state in checkpoints); never installed. */
#ifndef TESSERA_CORE_OPTIM_IMPL_H
#define TESSERA_CORE_OPTIM_IMPL_H
#include "internal.h"

typedef enum optim_kind { O_SGD, O_ADAM, O_ADAMW } optim_kind;
extern const char *const ts__optim_kind_names[3]; /* by optim_kind */

typedef struct slot {
    char name[96];
    ts_tensor *param;     /* owned reference */
    ts_tensor *state[2];  /* sgd: momentum buffer; adam: first and second moments */
    int own_decay;        /* weight_decay below replaces the optimizer's (a parameter group) */
    double weight_decay;
} slot;

struct ts_optim {
    int kind;
    ts_sgd_options sgd;
    ts_adam_options adam;
    int64_t steps;
    int fused; /* use the plugin's fused kernel when it has one */
    int scheduled; /* sched sets lr before every step */
    ts_lr_schedule sched;
    size_t n;
    slot *slots;
    struct ts__zero *zero; /* sharded over the ranks (core/zero.c), else NULL */
};

/* The sharded optimizer (core/zero.c). zero_step: ts_optim_step of a sharded one; zero_free:
 * back to unsharded and its shards freed (the state goes with them); zero_saveable: whether
 * ts_optim_save_state may write it (unsharded, or consolidated on this rank since the last
 * step); zero_loaded: a loaded whole state cut into this rank's pieces. */
ts_status ts__zero_step(ts_optim *o);
void ts__zero_free(ts_optim *o);
int ts__zero_saveable(const ts_optim *o);
ts_status ts__zero_loaded(ts_optim *o);

/* The state tensors' names, by (kind is SGD ? 0 : 1, state index). */
extern const char *const ts__optim_state_names[2][2];
/* ts_lr_schedule kinds' names. */
extern const char *const ts__lr_kind_names[3];
/* code naming `who` when sch is not a valid schedule. */
ts_status ts__check_schedule(const ts_lr_schedule *s, ts_status code, const char *who);

#endif /* TESSERA_CORE_OPTIM_IMPL_H */
