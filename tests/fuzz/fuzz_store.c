/* fuzz_store.c — libFuzzer harness: the rendezvous store's server-side request handling (handshake,
 * request parsing, waiting GETs, ADD) on arbitrary bytes, without sockets (store_fuzz_input in
 * store.c), seeds in tests/fuzz/store/. */
#include "fuzz_common.h"
#include "store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    store_fuzz_input(data, n);
    return 0;
}
