/* ops_ref.c — the plain C reference ops (see ops_ref.h), stamped out twice from ops_ref_impl.h:
 * float (_f32) is the CPU backend the trainer runs; double (_f64) is what the finite-difference
 * gradient checks in tests/test_ops_ref.c use, where float's rounding would swamp the check. */
#include "ops_ref.h"

#define T float
#define S _f32
#include "ops_ref_impl.h"
#undef T
#undef S

#define T double
#define S _f64
#include "ops_ref_impl.h"
#undef T
#undef S
