// The 128-byte-swizzle shared-memory layout of the Hopper path's tiles (hopper.cuh) and the wgmma
// matrix descriptors that read it, callable from host code too: tests/fixtures/wgmma_layout.cu
// checks, on the CPU, that every element wgmma reads through these descriptors (by the canonical
// layouts of the PTX ISA, as CuTe's make_gmma_desc states them) is the one the loader put there.
//
// Layout: a tile of ROWS rows x HEAD_DIM 16-bit elements is stored as column blocks of 64 elements
// (128 bytes); a block holds its ROWS rows as 8-row x 128-byte atoms (1024 bytes), and 16-byte chunk
// c of row r sits at chunk c ^ (r % 8) of its 128-byte row. The hardware applies that XOR from
// address bits 7..9 onto bits 4..6, so every tile must start 1024-byte aligned.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define SW128_FN __host__ __device__ __forceinline__
#else
#define SW128_FN inline
#endif

// Bytes of one 8-row atom, and between the 8-row groups of a column block (the descriptors' SBO).
constexpr uint32_t kSw128AtomBytes = 1024;

// Byte offset of 16-byte chunk `chunk` (elements 8 chunk .. 8 chunk + 7) of row r in a ROWS-row tile.
template <int ROWS>
SW128_FN uint32_t sw128_offset(int r, int chunk) {
    static_assert(ROWS % 8 == 0, "a tile is whole 8-row atoms");
    return uint32_t(chunk / 8) * (ROWS * 128) + uint32_t(r / 8) * kSw128AtomBytes + uint32_t(r % 8) * 128 +
           uint32_t((chunk % 8) ^ (r % 8)) * 16;
}

// A wgmma shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address,
// leading and stride byte offsets (each >> 4, 14 bits), base offset 0, layout 1 = 128-byte swizzle
// in bits 62..63.
SW128_FN uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
           (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

// K-major operand (Q and K, the K dimension along the row): k-step kd (elements 16 kd .. 16 kd + 15)
// starts 32 bytes further into the atom row, and in the next column block every 4 steps. The
// descriptor's SBO is the next 8 rows; its LBO is unused by swizzled K-major layouts (CuTe sets 1).
template <int ROWS>
SW128_FN uint32_t sw128_kmajor_step(int kd) {
    return uint32_t(kd / 4) * (ROWS * 128) + uint32_t(kd % 4) * 32;
}
template <int ROWS>
SW128_FN uint64_t sw128_kmajor_desc(uint32_t tile, int kd) {
    return sw128_desc(tile + sw128_kmajor_step<ROWS>(kd), 16, kSw128AtomBytes);
}

// MN-major operand (V read transposed for O += P V: K = the tile's rows, N = its elements): k-step
// kk (rows 16 kk .. 16 kk + 15) is two atoms further; the LBO is the next 64-element column block,
// the SBO the next 8 rows.
SW128_FN uint32_t sw128_mnmajor_step(int kk) {
    return uint32_t(kk) * 2 * kSw128AtomBytes;
}
template <int ROWS>
SW128_FN uint64_t sw128_mnmajor_desc(uint32_t tile, int kk) {
    return sw128_desc(tile + sw128_mnmajor_step(kk), ROWS * 128, kSw128AtomBytes);
}

// The descriptor of `desc`'s operand moved `offset` bytes (a multiple of 16) further, by an add to
// its low word: the start-address field (bits 0..13) holds a shared-memory address >> 4, and a
// shared-memory address stays under 2^18, so the sum never carries into the LBO at bit 16.
// sw128_desc_advance(sw128_kmajor_desc<R>(tile, 0), sw128_kmajor_step<R>(kd)) ==
// sw128_kmajor_desc<R>(tile, kd), and likewise MN-major (tests/fixtures/wgmma_layout.cu).
SW128_FN uint64_t sw128_desc_advance(uint64_t desc, uint32_t offset) {
    return (desc & ~uint64_t(0xFFFFFFFFu)) | uint32_t(uint32_t(desc) + (offset >> 4));
}

// The same as one 64-bit add (DESC_ADVANCE = 2): the low word never carries into the high one,
// so the sum equals sw128_desc_advance's, and `offset` may span whole tiles (a stage's tile from
// stage 0's) while the address stays in shared memory.
SW128_FN uint64_t sw128_desc_plus(uint64_t desc, uint32_t offset) {
    return desc + (offset >> 4);
}

// A loader thread's walk down a ROWS-row tile: it keeps one 16-byte column chunk and visits rows
// r0, r0 + ROWS_PER_ITER, r0 + 2 ROWS_PER_ITER, ... Row r0 + k sits k / 8 whole atoms past row
// r0 + k % 8, so the walk keeps one offset per distinct (row % 8) it meets (one when its rows
// are a multiple of 8 apart, two at 4 or 12 apart) and adds compile-time atom offsets to them:
// at(it) == sw128_offset<ROWS>(r0 + it * ROWS_PER_ITER, chunk), checked on the host by
// tests/fixtures/wgmma_layout.cu.
template <int ROWS, int ROWS_PER_ITER>
struct Sw128RowWalk {
    static constexpr int kResidueStep = ROWS_PER_ITER % 8 == 0   ? 8
                                        : ROWS_PER_ITER % 4 == 0 ? 4
                                        : ROWS_PER_ITER % 2 == 0 ? 2
                                                                 : 1;
    static constexpr int kPhases = 8 / kResidueStep;
    uint32_t phase[kPhases];

    SW128_FN Sw128RowWalk(int r0, int chunk) {
        for (int ph = 0; ph < kPhases; ++ph) phase[ph] = sw128_offset<ROWS>(r0 + ph * kResidueStep, chunk);
    }
    SW128_FN uint32_t at(int it) const {
        return phase[it * ROWS_PER_ITER % 8 / kResidueStep] + uint32_t(it * ROWS_PER_ITER / 8) * kSw128AtomBytes;
    }
};
