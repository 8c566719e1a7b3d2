// paraid parity on the GPU: one kernel for gen, recover and check of a batch of RAID5/RAID6 stripes.
//
// GF(2^8) with polynomial 0x11d and generator {02} (Linux md, ISA-L). Per stripe and per byte column:
//   u = (P if loaded) ^ XOR of the loaded data chunks
//   v = (Q if loaded) ^ sum of 2^i * D_i over the loaded data chunks (Horner's rule: only *{02})
// and every output chunk is  coef[o][0] * u  ^  coef[o][1] * v.  The host picks which chunks are
// loaded and the coefficients, so gen (P = u, Q = v), every 1- and 2-erasure recovery, and check
// (u = v = 0 everywhere) are all this one pass. See src/cuda/plan.rs for the cases.
//
// Layout: the input region holds, per stripe, `in_chunks` chunks of `pitch_words` 16-byte words
// (chunks padded with zeros to a whole word); the output region `out_chunks` chunks per stripe.
// One thread owns one 16-byte word column of one stripe, so a warp reads 512 contiguous bytes of
// each chunk.

#define PARAID_MAX_CHUNKS 256
#define PARAID_FLAG_CHECK 1u  // write bad[stripe] = 1 where u or v is non-zero; no outputs
#define PARAID_FLAG_NO_Q 2u   // RAID5 or no output needs v: skip the Q arithmetic

struct ParaidPlan {
    int k;                           // data chunks per stripe
    int in_chunks;                   // chunks per stripe in the input region
    int out_chunks;                  // chunks per stripe in the output region (0 to 2)
    int pitch_words;                 // 16-byte words per chunk
    unsigned int flags;
    int src_of[PARAID_MAX_CHUNKS];   // stripe index (data 0..k, P = k, Q = k+1) -> input chunk, or -1
    unsigned char coef[4];           // output o = coef[2o] * u ^ coef[2o+1] * v
};

// {02} * x on four packed bytes: shift left, and reduce where a top bit fell off.
__device__ __forceinline__ unsigned int mul2_u32(unsigned int x) {
    unsigned int top = (x >> 7) & 0x01010101u;
    return ((x & 0x7f7f7f7fu) << 1) ^ (top * 0x1du);
}

__device__ __forceinline__ uint4 mul2(uint4 v) {
    return make_uint4(mul2_u32(v.x), mul2_u32(v.y), mul2_u32(v.z), mul2_u32(v.w));
}

__device__ __forceinline__ uint4 xor4(uint4 a, uint4 b) {
    return make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
}

// c * v for a constant c, by shift-and-add over c's bits. c is the same for every thread, so the
// loop does not diverge; the common coefficients 0 and 1 cost nothing.
__device__ __forceinline__ uint4 mul_const(unsigned int c, uint4 v) {
    uint4 r = make_uint4(0u, 0u, 0u, 0u);
    while (c != 0u) {
        if (c & 1u) {
            r = xor4(r, v);
        }
        c >>= 1;
        if (c != 0u) {
            v = mul2(v);
        }
    }
    return r;
}

// Where a launch finds its plans and chunks. Slots: one plan; the stripes packed in one device buffer, chunk
// after chunk at a fixed pitch. InPlace: a table with one row of `stride` entries per stripe: the index of the
// stripe's plan among `plans` (stripes of one launch may differ in which chunks they lose: a rebuild's target
// rotates through data, P and Q from row to row), then the device addresses of its input chunks and its output
// chunks, pointing into host memory mapped into the device's address space, read and written where it lies (no
// staging copy). Every plan of a launch has the same pitch_words.
struct Slots {
    const ParaidPlan *plan;
    const uint4 *in;
    uint4 *out;
    int in_chunks;
    int out_chunks;
    size_t pitch;
    __device__ __forceinline__ const ParaidPlan *plan_of(int) const { return plan; }
    __device__ __forceinline__ const uint4 *input(int stripe, int at) const {
        return in + ((size_t)stripe * in_chunks + at) * pitch;
    }
    __device__ __forceinline__ uint4 *output(int stripe, const ParaidPlan *, int o) const {
        return out + ((size_t)stripe * out_chunks + o) * pitch;
    }
};

struct InPlace {
    const ParaidPlan *plans;
    const unsigned long long *table;
    int stride;
    __device__ __forceinline__ const unsigned long long *row(int stripe) const {
        return table + (size_t)stripe * stride;
    }
    __device__ __forceinline__ const ParaidPlan *plan_of(int stripe) const {
        return plans + __ldg(row(stripe));
    }
    __device__ __forceinline__ const uint4 *input(int stripe, int at) const {
        return (const uint4 *)__ldg(row(stripe) + 1 + at);
    }
    __device__ __forceinline__ uint4 *output(int stripe, const ParaidPlan *plan, int o) const {
        return (uint4 *)__ldg(row(stripe) + 1 + __ldg(&plan->in_chunks) + o);
    }
};

// Plans live in device memory (copied in on the stream before each launch), not in the kernel's parameters:
// src_of is indexed with a loop variable, and a dynamically indexed by-value parameter could be copied to
// per-thread local memory. Every thread of a warp reads the same plan words, which the cache broadcasts.
template <class Chunks>
__device__ __forceinline__ void stripe_columns(const Chunks chunks, const int pitch_words,
                                               unsigned int *__restrict__ bad, const int stripes) {
    const int word = blockIdx.x * blockDim.x + threadIdx.x;
    if (word >= pitch_words) {
        return;
    }
    for (int stripe = blockIdx.y; stripe < stripes; stripe += gridDim.y) {
        const ParaidPlan *plan = chunks.plan_of(stripe);
        const int k = __ldg(&plan->k);
        const int out_chunks = __ldg(&plan->out_chunks);
        const unsigned int flags = __ldg(&plan->flags);
        const bool want_q = (flags & PARAID_FLAG_NO_Q) == 0u;
        // P and Q slots; a RAID5 stripe of 255 data chunks has no Q slot inside src_of.
        const int p_at = __ldg(&plan->src_of[k]);
        const int q_at = k + 1 < PARAID_MAX_CHUNKS ? __ldg(&plan->src_of[k + 1]) : -1;
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll 8
        for (int i = k - 1; i >= 0; --i) {
            const int at = __ldg(&plan->src_of[i]);
            if (want_q) {
                v = mul2(v);
            }
            if (at >= 0) {
                const uint4 d = __ldg(chunks.input(stripe, at) + word);
                u = xor4(u, d);
                v = xor4(v, d);
            }
        }
        if (p_at >= 0) {
            u = xor4(u, __ldg(chunks.input(stripe, p_at) + word));
        }
        if (want_q && q_at >= 0) {
            v = xor4(v, __ldg(chunks.input(stripe, q_at) + word));
        }
        if (flags & PARAID_FLAG_CHECK) {
            const unsigned int any = u.x | u.y | u.z | u.w | (want_q ? (v.x | v.y | v.z | v.w) : 0u);
            if (any != 0u) {
                bad[stripe] = 1u;  // every writer writes the same value
            }
            continue;
        }
        for (int o = 0; o < out_chunks; ++o) {
            const unsigned int coef_u = __ldg(&plan->coef[2 * o]);
            const unsigned int coef_v = __ldg(&plan->coef[2 * o + 1]);
            chunks.output(stripe, plan, o)[word] = xor4(mul_const(coef_u, u), mul_const(coef_v, v));
        }
    }
}

extern "C" __global__ void paraid_stripe(const ParaidPlan *__restrict__ plan,
                                         const uint4 *__restrict__ in,
                                         uint4 *__restrict__ out,
                                         unsigned int *__restrict__ bad,
                                         const int stripes) {
    Slots chunks;
    chunks.plan = plan;
    chunks.in = in;
    chunks.out = out;
    chunks.in_chunks = __ldg(&plan->in_chunks);
    chunks.out_chunks = __ldg(&plan->out_chunks);
    chunks.pitch = (size_t)__ldg(&plan->pitch_words);
    stripe_columns(chunks, __ldg(&plan->pitch_words), bad, stripes);
}

// The same pass over chunks in mapped host memory, each stripe with its own plan (see InPlace above).
extern "C" __global__ void paraid_stripe_in_place(const ParaidPlan *__restrict__ plans,
                                                  const unsigned long long *__restrict__ table,
                                                  const int stride,
                                                  unsigned int *__restrict__ bad,
                                                  const int stripes) {
    InPlace chunks;
    chunks.plans = plans;
    chunks.table = table;
    chunks.stride = stride;
    stripe_columns(chunks, __ldg(&plans[0].pitch_words), bad, stripes);
}
