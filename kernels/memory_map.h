/* The compressive memory's update as a map (SPEC 4), for sequence parallelism: a run of
 * segments turns the memory M it started from into A M + B (per head, A and B [d, d]), and z
 * into z + the sum of sigma(k). For the linear rule A = I and B = sum sigma(K)^T V; for the
 * delta rule segment s gives A_s = I - sigma(K)^T D sigma(K), B_s = sigma(K)^T V, with
 * D = diag(1 / (sigma(k_t) . z_{s-1})) (0 where the product is 0), and maps compose:
 * (A2, B2) o (A1, B1) = (A2 A1, A2 B1 + B2). So ranks holding consecutive runs of a stream can
 * each build their run's map, combine them in a scan, and learn the exact memory at the start
 * of their run without waiting for the ranks before them to finish.
 *
 * Host memory, double precision: maps are composed over many segments and then applied to a
 * float32 memory, so they are kept wider than the memory itself. sigma and the denominators are
 * computed exactly as the CPU backend's memory update computes them (kernels/cpu), so a map
 * applied to M agrees with that update up to the rounding of float32 against double.
 * Layouts: A, B, M [heads][d][d] row-major; z [heads][d]; k, v rows of `ld` floats, head h's
 * component e at column h*d + e. None of these functions allocate more than a segment's
 * scratch; they return SF_OK or SF_E_NOMEM. */
#ifndef SEQFLOW_KERNELS_MEMORY_MAP_H
#define SEQFLOW_KERNELS_MEMORY_MAP_H

#include "seqflow/backend.h"

/* A = I (when A is not NULL), B = 0. */
void sf_memory_map_identity(int heads, int d, double *A, double *B);

/* sk[i*ld + h*d + e] = sigma(k[i*ld + h*d + e]) for n rows of heads*d (the CPU update's sigma),
 * and, when z_increment is not NULL, its float32 increment of z: per head and component, the
 * double sum over the rows, rounded once. */
void sf_memory_sigma(int n, int heads, int d, int ld, const float *k, float *sk, float *z_increment);

/* Appends one segment of n rows to the map (A, B): (A, B) <- (A_s A, A_s B + B_s). z is the
 * float32 z the memory had before this segment (the delta rule's denominators; unused by the
 * linear rule). A may be NULL for the linear rule (it stays I). z_increment, when not NULL,
 * receives the segment's float32 increment of z, as the CPU backend adds it: per head and
 * component, the double sum of sigma(k) over the rows, rounded once. B NULL: only that. threads: OpenMP threads
 * over the heads (0 = the default). */
int sf_memory_map_segment(sf_memory_kind kind, int n, int heads, int d, int ld, const float *k, const float *v,
                          const float *z, double *A, double *B, float *z_increment, int threads);
/* The same from sk = sf_memory_sigma's sigma(k) instead of k (no z increment). */
int sf_memory_map_segment_sigma(sf_memory_kind kind, int n, int heads, int d, int ld, const float *sk, const float *v,
                                const float *z, double *A, double *B, int threads);

/* A segment's map kept in its two float32 parts, so that a caller that needs both the map and
 * the update (sequence parallelism: each rank maps its chunk, then walks it from the exact
 * memory) computes the products once. Per head [d][d]: P = sigma(K)^T V and, for the delta
 * rule, G = sigma(K)^T D sigma(K) (D from z, as in sf_memory_map_segment); the segment's map is
 * A_s = I - G, B_s = P (linear: A_s = I, B_s = P). sk: sf_memory_sigma's sigma(k), rows ld
 * apart. The products are the ones sf_memory_map_segment_sigma computes, bit for bit. G is only
 * written (and may be NULL) for the linear rule. */
int sf_memory_map_parts(sf_memory_kind kind, int n, int heads, int d, int ld, const float *sk, const float *v,
                        const float *z, float *P, float *G, int threads);
/* (A, B) <- (A_s A, A_s B + B_s) for the segment of parts (P, G): sf_memory_map_parts then this
 * gives sf_memory_map_segment_sigma's bits. A NULL: linear. */
int sf_memory_map_then_parts(sf_memory_kind kind, int heads, int d, const float *P, const float *G, double *A,
                             double *B);
/* The memory update (SPEC 4) of one segment from its parts: per head M <- M + P - G M (the
 * delta rule; linear: M + P), in double and rounded once to float32; z <- z + z_increment (the
 * float32 sum, as the CPU update adds it). Mathematically the CPU update (M + sigma(K)^T
 * (V - D sigma(K) M)); the float32 roundings differ (relative 1e-7 a segment). Costs d^3 a head
 * instead of the update's 2 n d^2. */
int sf_memory_update_parts(sf_memory_kind kind, int heads, int d, const float *P, const float *G,
                           const float *z_increment, float *M, float *z);

/* (A, B) <- (A2, B2) o (A, B) = (A2 A, A2 B + B2): the map of (A, B)'s run followed by
 * (A2, B2)'s. A2 and A NULL: linear maps (B <- B + B2). Scratch: 2 d*d doubles, allocated. */
int sf_memory_map_then(int heads, int d, const double *A2, const double *B2, double *A, double *B);

/* M <- A M + B (A NULL: M + B), in double.
 * _then and _apply use plain loops in a fixed order, not BLAS: several ranks compose and apply
 * the same maps and must hold the same bits, whatever BLAS or CPU each has. */
int sf_memory_map_apply(int heads, int d, const double *A, const double *B, double *M);

#endif
