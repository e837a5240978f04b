/* step_cost.h - what one forward pass of the target costs, by the number of
 * tokens in it: the curve speculation is priced against.
 *
 * Speculative decoding pays only where verifying a tree of n tokens costs
 * less than the n plain steps it may save. On a GPU at batch 1 a pass is
 * bound by reading the weights and extra rows are nearly free; on a CPU, or
 * at a large batch, every row costs compute. Rather than guess, target-svc
 * measures it: at start-up it times passes of 1..64 tokens (one sequence,
 * causal, a short context), and afterwards folds the time of every real pass
 * into the curve (an exponential moving average: of the whole curve's level,
 * and of its shape at the grid points around the pass's size), so the curve
 * follows the context lengths and the load the target actually runs at.
 * GetInfo reports it; draft-svc keeps a copy per target, updated from the
 * forward time each step reports, and prices its trees with it
 * (draft-svc/tree_choice.h).
 *
 * The curve lives on a fixed grid of batch sizes: every size up to 16, then
 * coarser steps to 4096. A grid point without a measurement (us = 0) is
 * interpolated from its measured neighbours, or extrapolated along the last
 * measured slope. */
#ifndef SPECD_STEP_COST_H
#define SPECD_STEP_COST_H

#define SPECD_STEP_COST_MAX_POINTS 48

typedef struct specd_step_cost {
    int n;                                  /* grid points in use */
    int tokens[SPECD_STEP_COST_MAX_POINTS]; /* ascending batch sizes */
    double us[SPECD_STEP_COST_MAX_POINTS];  /* forward time in microseconds; 0 = unknown */
} specd_step_cost;

/* The grid up to max_tokens (at least the point 1), nothing measured. */
void specd_step_cost_init(specd_step_cost *c, int max_tokens);

/* Estimated microseconds for a pass of `tokens` tokens; 0 when nothing has
 * been measured. Monotone: a bigger pass is never estimated cheaper. */
double specd_step_cost_at(const specd_step_cost *c, int tokens);

/* The curve's own value at `tokens`, interpolated between grid points,
 * without the running maximum of specd_step_cost_at (0 where nothing near
 * was measured): for the difference between two nearby sizes, which a
 * stale high point at a smaller size must not flatten. */
double specd_step_cost_raw_at(const specd_step_cost *c, int tokens);

/* Folds one measured pass in, with weight alpha in (0, 1], in two parts.
 * The level, where the curve has measured the pass's size (on a measured
 * grid point or between two): every measured point is multiplied by the
 * pass's surprise (its time over the curve's own value there, capped to
 * within a factor SPECD_STEP_COST_LEVEL_CAP) to the power
 * alpha * SPECD_STEP_COST_LEVEL_SHARE. The shape: the grid points on either
 * side of `tokens` then move the rest of the way towards the measurement
 * (scaled by the curve's own ratio between them and `tokens`) with the
 * remaining weight, or all of it where the level did not move; an
 * unmeasured point takes it as is. Non-positive inputs are ignored.
 *
 * Why the level is most of it: the passes a client sees land on a few
 * sizes, and a point no pass lands on would otherwise keep whatever it was
 * last measured at. A draft-svc session that sends a tree every step never
 * runs a 1-token pass, so after a burst on shared cores its 1-token point
 * stayed high for the rest of the request, and with the running maximum of
 * specd_step_cost_at every tree up to that cost was priced as free: the
 * trees grew to 3-8 nodes and ran at 0.82-0.95x of plain
 * (docs/BENCHMARKS.md, thirtieth session). The shape (what a row adds)
 * changes slowly, with the context length; the level moves with the host. */
#define SPECD_STEP_COST_LEVEL_SHARE 0.9
#define SPECD_STEP_COST_LEVEL_CAP 4.0
void specd_step_cost_observe(specd_step_cost *c, int tokens, double us, double alpha);

/* Takes measured points from outside (GetInfo): keeps the grid, sets each
 * grid point that appears in tokens[] (other sizes are folded in with
 * alpha 1). Entries with tokens < 1 or us <= 0 are skipped. Returns how
 * many were taken. */
int specd_step_cost_load(specd_step_cost *c, const int *tokens, const double *us, int n);

/* Index of the grid point equal to tokens, or -1. */
int specd_step_cost_point(const specd_step_cost *c, int tokens);

#endif
