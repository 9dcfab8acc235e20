/* core/philox.h: one Philox4x32-10 block (Salmon et al., SC'11): ctr encrypted under key.
 * Internal, header-only: the generator (random.c) and the data loader's shuffle (data.c) use
 * it, and tests/unit/test-tensor checks it against the published known answers by including
 * this header; libtessera exports nothing of it. */
#ifndef TESSERA_CORE_PHILOX_H
#define TESSERA_CORE_PHILOX_H

#include <stdint.h>

static inline void ts__philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2],
                                     uint32_t out[4])
{
    uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
    uint32_t k0 = key_in[0], k1 = key_in[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

#endif /* TESSERA_CORE_PHILOX_H */
