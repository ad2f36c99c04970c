/*
 * vt_ctest: the C side of the C ABI tests (crates/vision-towers-c/tests/capi.rs, gpu.rs).
 *
 * Reads a script (argv[1]): one command a line, fields separated by tabs, and prints one result
 * line per command on stdout (tab-separated: the command, the status name, figures, the
 * message last). Rows go to files the script names, as raw little-endian values, for the Rust
 * test to compare with the Rust API's. Everything the library allocates is freed, so that
 * valgrind's leak check is meaningful.
 *
 * Images in commands: "file:<path>" (the file's bytes) or "uri:<path>" (the file holds a URI).
 * Videos (the video command): raw RGB frames from one file, or encoded frames as images.
 *
 * CUDA (encode_device, encode_tensors_device, oom) goes through the driver API, loaded with
 * dlopen("libcuda.so.1"), so this file builds without CUDA headers or libraries.
 */
#define _POSIX_C_SOURCE 200809L
#include "vision_towers.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FIELDS 64
#define MAX_SLOTS 8

static vt_model *slots[MAX_SLOTS];
static vt_tensors *tensors;

/* ---------------------------------------------------------------------------------------- */
/* Small helpers                                                                            */
/* ---------------------------------------------------------------------------------------- */

static void die(const char *what) {
    fprintf(stderr, "vt_ctest: %s\n", what);
    exit(2);
}

/* Reads a whole file; *len is its size. The buffer is never NULL (an empty file gives a
 * one-byte allocation), so an empty image still has a valid pointer. */
static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "vt_ctest: cannot open %s\n", path);
        exit(2);
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    if (!buf) die("out of memory");
    for (;;) {
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            if (!buf) die("out of memory");
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    *len = n;
    return buf;
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "vt_ctest: cannot write %s\n", path);
        exit(2);
    }
    if (len && fwrite(data, 1, len, f) != len) die("short write");
    fclose(f);
}

/* The message of the last call, with tabs and newlines flattened so it stays one field. */
static void print_message(void) {
    const char *m = vt_last_error();
    putchar('\t');
    for (; *m; m++) putchar(*m == '\t' || *m == '\n' ? ' ' : *m);
    putchar('\n');
}

static vt_model *slot(const char *s) {
    int i = atoi(s);
    if (i < 0 || i >= MAX_SLOTS) die("bad slot");
    return slots[i];
}

/* Images named by fields: their bytes, owned by `bufs`. */
typedef struct {
    vt_image *images;
    unsigned char **bufs;
    size_t n;
} image_list;

static image_list load_images(char **fields, size_t n) {
    image_list l = {calloc(n ? n : 1, sizeof(vt_image)), calloc(n ? n : 1, sizeof(char *)), n};
    if (!l.images || !l.bufs) die("out of memory");
    for (size_t i = 0; i < n; i++) {
        const char *f = fields[i];
        size_t len;
        if (strncmp(f, "file:", 5) == 0) {
            l.bufs[i] = read_file(f + 5, &len);
            l.images[i].kind = VT_IMAGE_BYTES;
        } else if (strncmp(f, "uri:", 4) == 0) {
            l.bufs[i] = read_file(f + 4, &len);
            l.images[i].kind = VT_IMAGE_DATA_URI;
        } else {
            die("an image is file:<path> or uri:<path>");
        }
        l.images[i].data = l.bufs[i];
        l.images[i].len = len;
    }
    return l;
}

static void free_images(image_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->bufs[i]);
    free(l->bufs);
    free(l->images);
}

static void print_offsets(const size_t *o, size_t n) {
    putchar('\t');
    for (size_t i = 0; i < n; i++) printf("%s%zu", i ? "," : "", o[i]);
    if (!n) putchar('-');
}

/* ---------------------------------------------------------------------------------------- */
/* CUDA driver API through dlopen                                                           */
/* ---------------------------------------------------------------------------------------- */

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

static struct {
    void *lib;
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*primary_release)(CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*stream_sync)(CUstream);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*memset_d8_async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*memcpy_dtoh_async)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*default_mem_pool)(void **, CUdevice);
    CUresult (*mem_pool_trim_to)(void *, size_t);
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    int ready;
} cu;

static void *sym(const char *name) {
    void *p = dlsym(cu.lib, name);
    if (!p) {
        fprintf(stderr, "vt_ctest: libcuda has no %s\n", name);
        exit(2);
    }
    return p;
}

#define CU(call)                                                                   \
    do {                                                                           \
        CUresult r_ = (call);                                                      \
        if (r_ != 0) {                                                             \
            fprintf(stderr, "vt_ctest: %s failed: CUresult %d\n", #call, r_);      \
            exit(2);                                                               \
        }                                                                          \
    } while (0)

/* The caller's side: the model's device's primary context (the one the library uses, as the
 * CUDA runtime and PyTorch do) and a stream of our own. Returns 0 when there is no driver. */
static int cuda_setup(int ordinal) {
    if (cu.ready) return 1;
    cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu.lib) return 0;
    *(void **)&cu.init = sym("cuInit");
    *(void **)&cu.device_get = sym("cuDeviceGet");
    *(void **)&cu.primary_retain = sym("cuDevicePrimaryCtxRetain");
    *(void **)&cu.primary_release = sym("cuDevicePrimaryCtxRelease_v2");
    *(void **)&cu.ctx_set_current = sym("cuCtxSetCurrent");
    *(void **)&cu.stream_create = sym("cuStreamCreate");
    *(void **)&cu.stream_destroy = sym("cuStreamDestroy_v2");
    *(void **)&cu.stream_sync = sym("cuStreamSynchronize");
    *(void **)&cu.mem_alloc = sym("cuMemAlloc_v2");
    *(void **)&cu.mem_free = sym("cuMemFree_v2");
    *(void **)&cu.memset_d8_async = sym("cuMemsetD8Async");
    *(void **)&cu.memcpy_dtoh_async = sym("cuMemcpyDtoHAsync_v2");
    *(void **)&cu.default_mem_pool = sym("cuDeviceGetDefaultMemPool");
    *(void **)&cu.mem_pool_trim_to = sym("cuMemPoolTrimTo");
    CU(cu.init(0));
    CU(cu.device_get(&cu.dev, ordinal));
    CU(cu.primary_retain(&cu.ctx, cu.dev));
    CU(cu.ctx_set_current(cu.ctx));
    CU(cu.stream_create(&cu.stream, 1 /* CU_STREAM_NON_BLOCKING */));
    cu.ready = 1;
    return 1;
}

static void cuda_teardown(void) {
    if (!cu.ready) return;
    CU(cu.stream_sync(cu.stream));
    CU(cu.stream_destroy(cu.stream));
    CU(cu.primary_release(cu.dev));
    dlclose(cu.lib);
    cu.ready = 0;
}

static size_t dtype_size(unsigned dtype) {
    return dtype == VT_DTYPE_BF16 || dtype == VT_DTYPE_F16 ? 2 : 4;
}

/* Allocates `elements` of `dtype` (at least one byte), poisoned with 0xff bytes (NaN in every
 * dtype) on the caller's stream: the library must order its writes after this. */
static CUdeviceptr device_buffer(size_t elements, unsigned dtype) {
    size_t bytes = elements * dtype_size(dtype);
    CUdeviceptr p = 0;
    CU(cu.mem_alloc(&p, bytes ? bytes : 1));
    if (bytes) CU(cu.memset_d8_async(p, 0xff, bytes, cu.stream));
    return p;
}

/* Copies `bytes` back in the caller's stream order (after the rows) and writes them out. */
static void device_dump(CUdeviceptr p, size_t bytes, const char *path) {
    unsigned char *host = malloc(bytes ? bytes : 1);
    if (!host) die("out of memory");
    if (bytes) CU(cu.memcpy_dtoh_async(host, p, bytes, cu.stream));
    CU(cu.stream_sync(cu.stream));
    write_file(path, host, bytes);
    free(host);
}

/* ---------------------------------------------------------------------------------------- */
/* Commands                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* open <slot> <path> <device> <precision> <max_soft_tokens> <max_image_tokens> <max_pixels>
 *      <max_patches_per_pass> */
static void cmd_open(char **f, size_t n) {
    if (n < 9) die("open: 8 arguments");
    int i = atoi(f[1]);
    if (i < 0 || i >= MAX_SLOTS) die("bad slot");
    vt_open_options o = vt_open_options_default();
    o.device = f[3];
    o.precision = (uint32_t)strtoul(f[4], NULL, 10);
    o.max_soft_tokens = (uint32_t)strtoul(f[5], NULL, 10);
    o.max_image_tokens = strtoull(f[6], NULL, 10);
    o.max_pixels = strtoull(f[7], NULL, 10);
    o.max_patches_per_pass = strtoull(f[8], NULL, 10);
    vt_model *m = (vt_model *)0x1; /* must stay as it is on failure */
    vt_status s = vt_model_open(f[2], &o, &m);
    if (s == VT_OK) {
        vt_model_free(slots[i]);
        slots[i] = m;
        printf("open\t%s\t%s\t%zu\t%d\t%d\t%d", vt_status_name(s), vt_model_family_name(m),
               vt_model_width(m), (int)vt_model_lm_attention(m), vt_model_device_ordinal(m),
               (int)vt_model_precision(m));
    } else {
        printf("open\t%s\t%s\t0\t0\t0\t0", vt_status_name(s),
               m == (vt_model *)0x1 ? "untouched" : "WRITTEN");
    }
    print_message();
}

/* free <slot> */
static void cmd_free(char **f, size_t n) {
    if (n < 2) die("free: 1 argument");
    int i = atoi(f[1]);
    if (i < 0 || i >= MAX_SLOTS) die("bad slot");
    vt_model_free(slots[i]);
    slots[i] = NULL;
    printf("free\tVT_OK\n");
}

/* plan <slot> <image>: the plan line, then one "run" line per prompt run */
static void cmd_plan(char **f, size_t n) {
    if (n < 3) die("plan: 2 arguments");
    image_list l = load_images(f + 2, 1);
    vt_plan *p = NULL;
    vt_status s = vt_model_plan(slot(f[1]), &l.images[0], &p);
    if (s != VT_OK) {
        printf("plan\t%s\t%lld\t0\t0\t-\t-\t-", vt_status_name(s), (long long)vt_last_error_image());
        print_message();
        free_images(&l);
        return;
    }
    printf("plan\t%s\t-1\t%llu\t%llu\t%ux%u\t%llux%llu\t", vt_status_name(s),
           (unsigned long long)vt_plan_rows(p), (unsigned long long)vt_plan_prompt_len(p),
           vt_plan_image_width(p), vt_plan_image_height(p),
           (unsigned long long)vt_plan_target_width(p),
           (unsigned long long)vt_plan_target_height(p));
    const uint64_t *grid = vt_plan_grid(p);
    for (size_t i = 0; i < vt_plan_grid_len(p); i++)
        printf("%s%llu", i ? "," : "", (unsigned long long)grid[i]);
    print_message();
    const uint32_t *ids = vt_plan_run_ids(p);
    const uint64_t *counts = vt_plan_run_counts(p);
    const uint8_t *embeds = vt_plan_run_embeds(p);
    for (size_t i = 0; i < vt_plan_run_count(p); i++) {
        long long id = ids[i] == VT_TOKEN_UNKNOWN ? -1 : (long long)ids[i];
        printf("run\t%lld\t%llu\t%u\t%s\n", id, (unsigned long long)counts[i], embeds[i],
               vt_plan_run_text(p, i));
    }
    if (vt_plan_run_text(p, vt_plan_run_count(p)) != NULL) die("run text past the end");
    vt_plan_free(p);
    free_images(&l);
}

/* encode <slot> <out> <image>...: rows the library allocates */
static void cmd_encode(char **f, size_t n) {
    if (n < 4) die("encode: 3 arguments or more");
    image_list l = load_images(f + 3, n - 3);
    vt_rows *r = NULL;
    vt_status s = vt_model_encode(slot(f[1]), l.images, l.n, &r);
    if (s == VT_OK) {
        size_t rows = vt_rows_count(r), width = vt_rows_width(r);
        if (vt_rows_images(r) != l.n) die("vt_rows_images differs from the images given");
        printf("encode\t%s\t-1\t%zu\t%zu", vt_status_name(s), rows, width);
        print_offsets(vt_rows_offsets(r), vt_rows_images(r) + 1);
        write_file(f[2], vt_rows_data(r), rows * width * sizeof(float));
        vt_rows_free(r);
    } else {
        printf("encode\t%s\t%lld\t0\t0\t-", vt_status_name(s), (long long)vt_last_error_image());
    }
    print_message();
    free_images(&l);
}

/* encode_into <slot> <capacity> <out> <image>...: the caller's buffer */
static void cmd_encode_into(char **f, size_t n) {
    if (n < 5) die("encode_into: 4 arguments or more");
    image_list l = load_images(f + 4, n - 4);
    size_t cap = strtoull(f[2], NULL, 10);
    float *buf = malloc((cap ? cap : 1) * sizeof(float));
    size_t *offsets = malloc((l.n + 1) * sizeof(size_t));
    if (!buf || !offsets) die("out of memory");
    memset(buf, 0xff, (cap ? cap : 1) * sizeof(float));
    memset(offsets, 0xff, (l.n + 1) * sizeof(size_t));
    size_t needed = (size_t)-1;
    vt_status s = vt_model_encode_into(slot(f[1]), l.images, l.n, buf, cap, offsets, &needed);
    printf("encode_into\t%s\t%lld\t", vt_status_name(s), (long long)vt_last_error_image());
    if (needed == (size_t)-1) printf("-");
    else printf("%zu", needed);
    if (s == VT_OK) {
        print_offsets(offsets, l.n + 1);
        write_file(f[3], buf, needed * sizeof(float));
    } else {
        /* nothing but *needed may have been written */
        int untouched = 1;
        for (size_t i = 0; i < l.n + 1; i++) untouched &= offsets[i] == (size_t)-1;
        const unsigned char *b = (const unsigned char *)buf;
        for (size_t i = 0; i < cap * sizeof(float); i++) untouched &= b[i] == 0xff;
        printf("\t%s", untouched ? "untouched" : "WRITTEN");
    }
    print_message();
    free(buf);
    free(offsets);
    free_images(&l);
}

/* Whether two video plans say the same (rows, pieces, sampled frames, grid). */
static int same_video_plan(const vt_video_plan *a, const vt_video_plan *b) {
    size_t n = vt_video_plan_piece_count(a), k = vt_video_plan_frame_count(a);
    if (vt_video_plan_rows(a) != vt_video_plan_rows(b) || n != vt_video_plan_piece_count(b) ||
        k != vt_video_plan_frame_count(b))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (vt_video_plan_piece_ids(a)[i] != vt_video_plan_piece_ids(b)[i] ||
            vt_video_plan_piece_counts(a)[i] != vt_video_plan_piece_counts(b)[i] ||
            vt_video_plan_piece_embeds(a)[i] != vt_video_plan_piece_embeds(b)[i] ||
            vt_video_plan_piece_is_text(a)[i] != vt_video_plan_piece_is_text(b)[i] ||
            strcmp(vt_video_plan_piece_text(a, i), vt_video_plan_piece_text(b, i)))
            return 0;
    for (size_t i = 0; i < k; i++)
        if (vt_video_plan_frames_indices(a)[i] != vt_video_plan_frames_indices(b)[i] ||
            vt_video_plan_timestamps(a)[i] != vt_video_plan_timestamps(b)[i])
            return 0;
    return !memcmp(vt_video_plan_grid(a), vt_video_plan_grid(b), 3 * sizeof(uint64_t)) &&
           vt_video_plan_target_width(a) == vt_video_plan_target_width(b) &&
           vt_video_plan_target_height(a) == vt_video_plan_target_height(b);
}

/* video <slot> <out> <fps> <num_frames> <n_frames> <width> <height> [<frame>...]: one video.
 * width > 0: raw RGB frames, from the one file named ("file:<path>"; none: no bytes at all);
 * width 0: encoded frames (images as elsewhere), or with none named `n_frames` zeroed
 * vt_images (empty: a frame the library read would be refused as no image). Plans it
 * (vt_model_plan_video), then encodes it: the video line (encode's status, image, rows, width,
 * sampled indices, grid, the plan call's status, whether its plan equals encode's, whether
 * vt_model_encode_video_into gives the same rows and refuses a buffer one short), then one
 * piece line per prompt piece (id, count, embeds, is_text, text). */
static void cmd_video(char **f, size_t n) {
    if (n < 8) die("video: 7 arguments or more");
    vt_video v;
    memset(&v, 0, sizeof v);
    v.fps = strtod(f[3], NULL);
    vt_video_settings set = vt_video_settings_default();
    set.num_frames = strtoull(f[4], NULL, 10);
    v.n_frames = strtoull(f[5], NULL, 10);
    v.width = (uint32_t)strtoul(f[6], NULL, 10);
    v.height = (uint32_t)strtoul(f[7], NULL, 10);
    image_list l = {NULL, NULL, 0};
    unsigned char *rgb = NULL;
    vt_image *zeroed = NULL;
    if (v.width > 0) {
        if (n > 8) {
            if (strncmp(f[8], "file:", 5) != 0) die("raw frames are file:<path>");
            rgb = read_file(f[8] + 5, &v.rgb_len);
            v.rgb = rgb;
        }
    } else if (n > 8) {
        l = load_images(f + 8, n - 8);
        v.frames = l.images;
    } else {
        zeroed = calloc(v.n_frames ? v.n_frames : 1, sizeof(vt_image));
        if (!zeroed) die("out of memory");
        v.frames = zeroed;
    }
    vt_video_plan *planned = NULL, *plan = NULL;
    vt_status ps = vt_model_plan_video(slot(f[1]), &v, &set, &planned);
    if ((ps == VT_OK) != (planned != NULL)) die("plan_video: out written against its status");
    vt_rows *r = NULL;
    vt_status s = vt_model_encode_video(slot(f[1]), &v, &set, &r, &plan);
    if (s == VT_OK) {
        size_t rows = vt_rows_count(r), width = vt_rows_width(r);
        if (vt_rows_images(r) != 1 || rows != vt_video_plan_rows(plan))
            die("video rows differ from their plan");
        printf("video\t%s\t-1\t%zu\t%zu\t", vt_status_name(s), rows, width);
        for (size_t i = 0; i < vt_video_plan_frame_count(plan); i++)
            printf("%s%llu", i ? "," : "", (unsigned long long)vt_video_plan_frames_indices(plan)[i]);
        const uint64_t *g = vt_video_plan_grid(plan);
        /* The caller's buffer: one element short (status, *needed, nothing written), exact. */
        size_t need = rows * width, got = (size_t)-1;
        float *buf = malloc((need ? need : 1) * sizeof(float));
        if (!buf) die("out of memory");
        memset(buf, 0xff, (need ? need : 1) * sizeof(float));
        vt_video_plan *p2 = NULL;
        vt_status short_s =
            vt_model_encode_video_into(slot(f[1]), &v, &set, buf, need - 1, &got, &p2);
        int into = short_s == VT_ERR_BUFFER_TOO_SMALL && got == need && !p2;
        const unsigned char *b = (const unsigned char *)buf;
        for (size_t i = 0; i < need * sizeof(float); i++) into &= b[i] == 0xff;
        got = (size_t)-1;
        into &= vt_model_encode_video_into(slot(f[1]), &v, &set, buf, need, &got, &p2) == VT_OK &&
                got == need && p2 && same_video_plan(p2, plan) &&
                !memcmp(buf, vt_rows_data(r), need * sizeof(float));
        vt_video_plan_free(p2);
        free(buf);
        printf("\t%llu,%llu,%llu\t%s\t%d\t%s", (unsigned long long)g[0], (unsigned long long)g[1],
               (unsigned long long)g[2], vt_status_name(ps),
               planned ? same_video_plan(planned, plan) : 0, into ? "into-ok" : "into-FAILED");
        print_message();
        write_file(f[2], vt_rows_data(r), rows * width * sizeof(float));
        for (size_t i = 0; i < vt_video_plan_piece_count(plan); i++) {
            uint32_t id = vt_video_plan_piece_ids(plan)[i];
            printf("piece\t%lld\t%llu\t%u\t%u\t%s\n",
                   id == VT_TOKEN_UNKNOWN ? -1 : (long long)id,
                   (unsigned long long)vt_video_plan_piece_counts(plan)[i],
                   vt_video_plan_piece_embeds(plan)[i], vt_video_plan_piece_is_text(plan)[i],
                   vt_video_plan_piece_text(plan, i));
        }
        if (vt_video_plan_piece_text(plan, vt_video_plan_piece_count(plan)) != NULL)
            die("piece text past the end");
        vt_rows_free(r);
        vt_video_plan_free(plan);
    } else {
        if (r || plan) die("encode_video: out written on a refusal");
        printf("video\t%s\t%lld\t0\t0\t-\t-\t%s\t0\t-", vt_status_name(s),
               (long long)vt_last_error_image(), vt_status_name(ps));
        print_message();
    }
    vt_video_plan_free(planned);
    free(rgb);
    free(zeroed);
    if (l.n) free_images(&l);
}

/* tensors_new: a fresh set (the previous one freed) */
static void cmd_tensors_new(void) {
    vt_tensors_free(tensors);
    tensors = NULL;
    vt_status s = vt_tensors_new(&tensors);
    printf("tensors_new\t%s", vt_status_name(s));
    print_message();
}

/* tensor_f32|tensor_i64 <name> <data file> <dims, comma-separated, or "-" for a scalar>
 *   [<len>]: the values are the file's (len overrides how many are passed, to test the check) */
static void cmd_tensor(char **f, size_t n, int is_f32) {
    if (n < 4) die("tensor: 3 arguments");
    size_t bytes;
    unsigned char *data = read_file(f[2], &bytes);
    size_t shape[16], ndim = 0;
    if (strcmp(f[3], "-") != 0) {
        char *save = NULL;
        for (char *t = strtok_r(f[3], ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (ndim == 16) die("too many dimensions");
            shape[ndim++] = strtoull(t, NULL, 10);
        }
    }
    size_t len = bytes / (is_f32 ? sizeof(float) : sizeof(int64_t));
    if (n > 4) len = strtoull(f[4], NULL, 10);
    /* an aligned copy (read_file's buffer is malloc'd, hence aligned already) */
    vt_status s = is_f32
        ? vt_tensors_add_f32(tensors, f[1], ndim ? shape : NULL, ndim, (const float *)data, len)
        : vt_tensors_add_i64(tensors, f[1], ndim ? shape : NULL, ndim, (const int64_t *)data, len);
    printf("%s\t%s", is_f32 ? "tensor_f32" : "tensor_i64", vt_status_name(s));
    print_message();
    free(data);
}

/* encode_tensors <slot> <out> */
static void cmd_encode_tensors(char **f, size_t n) {
    if (n < 3) die("encode_tensors: 2 arguments");
    vt_rows *r = NULL;
    vt_status s = vt_model_encode_tensors(slot(f[1]), tensors, &r);
    if (s == VT_OK) {
        size_t rows = vt_rows_count(r), width = vt_rows_width(r);
        printf("encode_tensors\t%s\t%zu\t%zu", vt_status_name(s), rows, width);
        print_offsets(vt_rows_offsets(r), vt_rows_images(r) + 1);
        write_file(f[2], vt_rows_data(r), rows * width * sizeof(float));
        vt_rows_free(r);
    } else {
        printf("encode_tensors\t%s\t0\t0\t-", vt_status_name(s));
    }
    print_message();
}

/* encode_device <slot> <dtype 0|1|2> <capacity> <out> <image>...: a cuMemAlloc'd buffer, our
 * stream; the bytes are copied back in the stream's order, without a sync in between */
static void cmd_encode_device(char **f, size_t n) {
    if (n < 6) die("encode_device: 5 arguments or more");
    vt_model *m = slot(f[1]);
    if (!cuda_setup(vt_model_device_ordinal(m) < 0 ? 0 : vt_model_device_ordinal(m))) {
        printf("encode_device\tNO_DRIVER\n");
        return;
    }
    unsigned dtype = (unsigned)atoi(f[2]);
    size_t cap = strtoull(f[3], NULL, 10);
    image_list l = load_images(f + 5, n - 5);
    CUdeviceptr dst = device_buffer(cap, dtype);
    size_t *offsets = malloc((l.n + 1) * sizeof(size_t));
    if (!offsets) die("out of memory");
    size_t needed = (size_t)-1;
    vt_status s = vt_model_encode_device(m, l.images, l.n, (void *)(uintptr_t)dst, cap, dtype,
                                         cu.stream, offsets, &needed);
    printf("encode_device\t%s\t%lld\t", vt_status_name(s), (long long)vt_last_error_image());
    if (needed == (size_t)-1) printf("-");
    else printf("%zu", needed);
    if (s == VT_OK) {
        print_offsets(offsets, l.n + 1);
        device_dump(dst, needed * dtype_size(dtype), f[4]);
    } else {
        printf("\t-");
        CU(cu.stream_sync(cu.stream));
    }
    print_message();
    CU(cu.mem_free(dst));
    free(offsets);
    free_images(&l);
}

/* encode_tensors_device <slot> <dtype> <capacity> <out> */
static void cmd_encode_tensors_device(char **f, size_t n) {
    if (n < 5) die("encode_tensors_device: 4 arguments");
    vt_model *m = slot(f[1]);
    if (!cuda_setup(vt_model_device_ordinal(m) < 0 ? 0 : vt_model_device_ordinal(m))) {
        printf("encode_tensors_device\tNO_DRIVER\n");
        return;
    }
    unsigned dtype = (unsigned)atoi(f[2]);
    size_t cap = strtoull(f[3], NULL, 10);
    CUdeviceptr dst = device_buffer(cap, dtype);
    size_t offsets[65], images = 0;
    vt_status s = vt_model_encode_tensors_device(m, tensors, (void *)(uintptr_t)dst, cap, dtype,
                                                 cu.stream, offsets, 65, &images);
    printf("encode_tensors_device\t%s", vt_status_name(s));
    if (s == VT_OK) {
        print_offsets(offsets, images + 1);
        device_dump(dst, offsets[images] * vt_model_width(m) * dtype_size(dtype), f[4]);
    } else {
        printf("\t-");
        CU(cu.stream_sync(cu.stream));
    }
    print_message();
    CU(cu.mem_free(dst));
}

/* oom <slot> <out> <image>...: after one image warmed the model up, fill the card, encode all
 * images into a device buffer (expected: VT_ERR_OUT_OF_MEMORY), free the ballast, encode them
 * again (expected: VT_OK; the rows to <out>, f32) */
static void cmd_oom(char **f, size_t n) {
    if (n < 4) die("oom: 3 arguments or more");
    vt_model *m = slot(f[1]);
    if (!cuda_setup(vt_model_device_ordinal(m) < 0 ? 0 : vt_model_device_ordinal(m))) {
        printf("oom\tNO_DRIVER\n");
        return;
    }
    image_list l = load_images(f + 3, n - 3);
    size_t needed = 0;
    /* size the buffer first (headers only) and warm up on the first image */
    vt_status s = vt_model_encode_device(m, l.images, l.n, (void *)(uintptr_t)256, 0, VT_DTYPE_F32,
                                         cu.stream, NULL, &needed);
    if (s != VT_ERR_BUFFER_TOO_SMALL) die("oom: sizing the buffer did not say too small");
    CUdeviceptr dst = device_buffer(needed, VT_DTYPE_F32);
    s = vt_model_encode_device(m, l.images, 1, (void *)(uintptr_t)dst, needed, VT_DTYPE_F32,
                               cu.stream, NULL, NULL);
    if (s != VT_OK) die("oom: the warm-up encode failed");
    CU(cu.stream_sync(cu.stream));
    /* The library allocates from the device's default memory pool (stream-ordered), which keeps
     * what earlier handles in this process freed: hand that back first, so the ballast below
     * takes every byte the next allocation could use. */
    void *pool = NULL;
    CU(cu.default_mem_pool(&pool, cu.dev));
    CU(cu.mem_pool_trim_to(pool, 0));
    CUdeviceptr *ballast = NULL;
    size_t held = 0, count = 0, cap = 0;
    for (size_t chunk = (size_t)4 << 30; chunk >= (64 << 10); chunk /= 4) {
        for (;;) {
            CUdeviceptr p = 0;
            if (cu.mem_alloc(&p, chunk) != 0) break;
            if (count == cap) {
                cap = cap ? cap * 2 : 64;
                ballast = realloc(ballast, cap * sizeof(CUdeviceptr));
                if (!ballast) die("out of memory");
            }
            ballast[count++] = p;
            held += chunk;
        }
    }
    vt_status full = vt_model_encode_device(m, l.images, l.n, (void *)(uintptr_t)dst, needed,
                                            VT_DTYPE_F32, cu.stream, NULL, NULL);
    printf("oom\t%s\t%zu", vt_status_name(full), held);
    print_message();
    CU(cu.stream_sync(cu.stream));
    for (size_t i = 0; i < count; i++) CU(cu.mem_free(ballast[i]));
    free(ballast);
    size_t offsets[65];
    vt_status after = vt_model_encode_device(m, l.images, l.n, (void *)(uintptr_t)dst, needed,
                                             VT_DTYPE_F32, cu.stream, offsets, NULL);
    printf("oom_after\t%s", vt_status_name(after));
    if (after == VT_OK) {
        print_offsets(offsets, l.n + 1);
        device_dump(dst, needed * sizeof(float), f[2]);
    } else {
        printf("\t-");
    }
    print_message();
    CU(cu.mem_free(dst));
    free_images(&l);
}

/* threads <slot> <count> <image>: the same image encoded from <count> threads at once on one
 * const vt_model*; every thread's rows must be bitwise the same */
typedef struct {
    const vt_model *m;
    const vt_image *image;
    vt_rows *rows;
    vt_status status;
} job;

static void *thread_main(void *arg) {
    job *j = arg;
    j->status = vt_model_encode(j->m, j->image, 1, &j->rows);
    return NULL;
}

static void cmd_threads(char **f, size_t n) {
    if (n < 4) die("threads: 3 arguments");
    int count = atoi(f[2]);
    if (count < 1 || count > 16) die("threads: 1 to 16");
    image_list l = load_images(f + 3, 1);
    job jobs[16];
    pthread_t t[16];
    for (int i = 0; i < count; i++) {
        jobs[i] = (job){slot(f[1]), &l.images[0], NULL, VT_ERR_INTERNAL};
        if (pthread_create(&t[i], NULL, thread_main, &jobs[i]) != 0) die("pthread_create");
    }
    for (int i = 0; i < count; i++) pthread_join(t[i], NULL);
    int same = 1;
    for (int i = 0; i < count; i++) {
        if (jobs[i].status != VT_OK) {
            same = 0;
            continue;
        }
        size_t len = vt_rows_count(jobs[i].rows) * vt_rows_width(jobs[i].rows);
        if (len != vt_rows_count(jobs[0].rows) * vt_rows_width(jobs[0].rows) ||
            memcmp(vt_rows_data(jobs[i].rows), vt_rows_data(jobs[0].rows), len * sizeof(float)))
            same = 0;
    }
    printf("threads\t%s\t%s\n", vt_status_name(jobs[0].status), same ? "same" : "DIFFERENT");
    for (int i = 0; i < count; i++) vt_rows_free(jobs[i].rows);
    free_images(&l);
}

/* nulls <slot> <image> <model path>: NULL and bad arguments to every function; prints the checks that failed */
static int null_failures;
static void expect(int ok, const char *what) {
    if (!ok) {
        printf("\t%s", what);
        null_failures++;
    }
}

static void cmd_nulls(char **f, size_t n) {
    if (n < 4) die("nulls: 3 arguments");
    vt_model *m = slot(f[1]);
    image_list l = load_images(f + 2, 1);
    vt_model *mo = NULL;
    vt_plan *p = NULL;
    vt_rows *r = NULL;
    vt_tensors *t = NULL;
    float buf[4];
    size_t off[2] = {0, 0}, needed = 7;
    printf("nulls");
    expect(vt_model_open(NULL, NULL, &mo) == VT_ERR_NULL_ARGUMENT && !mo, "open path");
    expect(vt_model_open("x", NULL, NULL) == VT_ERR_NULL_ARGUMENT, "open out");
    vt_open_options bad = vt_open_options_default();
    bad.precision = 7;
    expect(vt_model_open("x", &bad, &mo) == VT_ERR_INVALID_ARGUMENT && !mo, "open precision");
    bad = vt_open_options_default();
    bad.device = "tpu:0";
    expect(vt_model_open("x", &bad, &mo) == VT_ERR_INVALID_ARGUMENT && !mo, "open device");
    expect(strstr(vt_last_error(), "tpu:0") != NULL, "open device message");
    expect(vt_model_open("/nonexistent/model", NULL, &mo) == VT_ERR_IO && !mo, "open missing");
    bad = vt_open_options_default();
    bad.max_soft_tokens = 100;
    expect(vt_model_open(f[3], &bad, &mo) == VT_ERR_INVALID_ARGUMENT && !mo, "open budget");
    bad = vt_open_options_default();
    bad.precision = VT_PRECISION_BF16;
    bad.device = "cpu";
    expect(vt_model_open(f[3], &bad, &mo) == VT_ERR_UNSUPPORTED && !mo, "open bf16 on cpu");
    bad.precision = VT_PRECISION_F16;
    expect(vt_model_open(f[3], &bad, &mo) == VT_ERR_UNSUPPORTED && !mo, "open f16 on cpu");
    expect(VT_PRECISION_F16 == 3 && VT_DTYPE_F16 == 2, "f16 enum values");
    expect(vt_model_family(NULL) == VT_FAMILY_NONE, "family NULL");
    expect(vt_model_family_name(NULL) == NULL, "family name NULL");
    expect(vt_model_width(NULL) == 0, "width NULL");
    expect(vt_model_lm_attention(NULL) == VT_LM_ATTENTION_CAUSAL, "lm NULL");
    expect(vt_model_device_ordinal(NULL) == -1, "ordinal NULL");
    expect(vt_model_precision(NULL) == VT_PRECISION_DEFAULT, "precision NULL");
    expect(vt_model_plan(NULL, &l.images[0], &p) == VT_ERR_NULL_ARGUMENT && !p, "plan model");
    expect(vt_model_plan(m, NULL, &p) == VT_ERR_NULL_ARGUMENT && !p, "plan image");
    expect(vt_model_plan(m, &l.images[0], NULL) == VT_ERR_NULL_ARGUMENT, "plan out");
    vt_image img = l.images[0];
    img.data = NULL;
    expect(vt_model_plan(m, &img, &p) == VT_ERR_NULL_ARGUMENT && !p, "plan data NULL with len");
    img = l.images[0];
    img.kind = 9;
    expect(vt_model_plan(m, &img, &p) == VT_ERR_INVALID_ARGUMENT && !p, "plan kind");
    expect(vt_plan_rows(NULL) == 0 && vt_plan_run_count(NULL) == 0 && !vt_plan_run_ids(NULL) &&
               !vt_plan_run_counts(NULL) && !vt_plan_run_embeds(NULL) &&
               !vt_plan_run_text(NULL, 0) && vt_plan_prompt_len(NULL) == 0 &&
               vt_plan_grid_len(NULL) == 0 && !vt_plan_grid(NULL) &&
               vt_plan_target_width(NULL) == 0 && vt_plan_target_height(NULL) == 0 &&
               vt_plan_image_width(NULL) == 0 && vt_plan_image_height(NULL) == 0,
           "plan getters NULL");
    expect(vt_model_encode(NULL, l.images, 1, &r) == VT_ERR_NULL_ARGUMENT && !r, "encode model");
    expect(vt_model_encode(m, NULL, 1, &r) == VT_ERR_NULL_ARGUMENT && !r, "encode images");
    expect(vt_model_encode(m, l.images, 0, &r) == VT_ERR_INVALID_ARGUMENT && !r, "encode none");
    expect(vt_model_encode(m, l.images, 1, NULL) == VT_ERR_NULL_ARGUMENT, "encode out");
    expect(vt_rows_data(NULL) == NULL && vt_rows_count(NULL) == 0 && vt_rows_width(NULL) == 0 &&
               vt_rows_images(NULL) == 0 && vt_rows_offsets(NULL) == NULL,
           "rows getters NULL");
    expect(vt_model_encode_into(m, l.images, 1, NULL, 4, off, &needed) == VT_ERR_NULL_ARGUMENT &&
               needed == 7,
           "encode_into out NULL with a length");
    expect(vt_model_encode_into(m, l.images, 1, (float *)((char *)buf + 1), 2, off, &needed) ==
                   VT_ERR_INVALID_ARGUMENT && needed == 7,
           "encode_into misaligned");
    expect(vt_model_encode_into(m, l.images, 1, buf, (size_t)-1 / 2, off, &needed) ==
                   VT_ERR_INVALID_ARGUMENT && needed == 7,
           "encode_into huge length");
    expect(vt_model_encode_device(m, l.images, 1, NULL, 0, 9, NULL, off, &needed) ==
                   VT_ERR_INVALID_ARGUMENT && needed == 7,
           "encode_device dtype");
    if (vt_model_device_ordinal(m) < 0)
        expect(vt_model_encode_device(m, l.images, 1, buf, 4, VT_DTYPE_F32, NULL, off, &needed) ==
                       VT_ERR_UNSUPPORTED && needed == 7,
               "encode_device on a CPU model");
    expect(vt_tensors_new(NULL) == VT_ERR_NULL_ARGUMENT, "tensors_new out");
    expect(vt_tensors_new(&t) == VT_OK && t, "tensors_new");
    size_t shape[2] = {2, 2};
    float vals[4] = {0};
    expect(vt_tensors_add_f32(NULL, "a", shape, 2, vals, 4) == VT_ERR_NULL_ARGUMENT, "add set");
    expect(vt_tensors_add_f32(t, NULL, shape, 2, vals, 4) == VT_ERR_NULL_ARGUMENT, "add name");
    expect(vt_tensors_add_f32(t, "a", NULL, 2, vals, 4) == VT_ERR_NULL_ARGUMENT, "add shape");
    expect(vt_tensors_add_f32(t, "a", shape, 2, NULL, 4) == VT_ERR_NULL_ARGUMENT, "add data");
    expect(vt_tensors_add_f32(t, "a", shape, 2, vals, 3) == VT_ERR_INVALID_ARGUMENT, "add fill");
    expect(vt_tensors_add_f32(t, "a", shape, 99, vals, 4) == VT_ERR_INVALID_ARGUMENT, "add ndim");
    expect(vt_tensors_add_f32(t, "\xff", shape, 2, vals, 4) == VT_ERR_INVALID_ARGUMENT, "add utf8");
    expect(vt_tensors_add_i64(t, "b", NULL, 0, (const int64_t *)off, 1) == VT_OK, "add scalar");
    expect(vt_model_encode_tensors(m, NULL, &r) == VT_ERR_NULL_ARGUMENT && !r, "tensors NULL");
    expect(vt_model_encode_tensors(NULL, t, &r) == VT_ERR_NULL_ARGUMENT && !r, "tensors model");
    expect(vt_model_encode_tensors(m, t, &r) == VT_ERR_INPUT && !r, "tensors missing");
    expect(vt_last_error()[0] != 0, "tensors missing message");
    expect(vt_model_encode_tensors_device(m, NULL, buf, 4, 0, NULL, NULL, 0, NULL) ==
               VT_ERR_NULL_ARGUMENT,
           "tensors_device NULL");
    /* video */
    {
        vt_video v;
        memset(&v, 0, sizeof v);
        vt_video_settings set = vt_video_settings_default();
        set.num_frames = 1;
        unsigned char px[3] = {1, 2, 3};
        v.rgb = px;
        v.rgb_len = 3;
        v.n_frames = 1;
        v.width = 1;
        v.height = 1;
        v.fps = 1.0;
        vt_video_plan *vp = NULL;
        expect(vt_model_encode_video(NULL, &v, &set, &r, &vp) == VT_ERR_NULL_ARGUMENT && !r && !vp,
               "video model");
        expect(vt_model_encode_video(m, NULL, &set, &r, &vp) == VT_ERR_NULL_ARGUMENT && !r && !vp,
               "video NULL");
        expect(vt_model_encode_video(m, &v, &set, NULL, &vp) == VT_ERR_NULL_ARGUMENT && !vp,
               "video out");
        expect(vt_model_plan_video(m, &v, &set, NULL) == VT_ERR_NULL_ARGUMENT, "plan_video out");
        expect(vt_model_plan_video(NULL, &v, &set, &vp) == VT_ERR_NULL_ARGUMENT && !vp,
               "plan_video model");
        v.frames = l.images;
        expect(vt_model_encode_video(m, &v, &set, &r, &vp) == VT_ERR_INVALID_ARGUMENT && !r && !vp,
               "video frames and rgb");
        v.frames = NULL;
        v.rgb = NULL;
        expect(vt_model_encode_video(m, &v, &set, &r, &vp) == VT_ERR_NULL_ARGUMENT && !r && !vp,
               "video rgb NULL with a length");
        v.rgb = (const uint8_t *)((uintptr_t)-2);
        v.rgb_len = (size_t)-1 / 2;
        expect(vt_model_encode_video(m, &v, &set, &r, &vp) == VT_ERR_INVALID_ARGUMENT && !r && !vp,
               "video rgb huge length");
        v.rgb = px;
        v.rgb_len = 3;
        v.width = 0;
        expect(vt_model_encode_video(m, &v, &set, &r, &vp) == VT_ERR_INVALID_ARGUMENT && !r && !vp,
               "video zero width");
        v.width = 1;
        vt_video_settings bad = set;
        bad.max_soft_tokens = 99;
        expect(vt_model_encode_video(m, &v, &bad, &r, &vp) == VT_ERR_INVALID_ARGUMENT && !r && !vp,
               "video max_soft_tokens");
        bad = set;
        bad.sample_fps = 2.0;
        expect(vt_model_plan_video(m, &v, &bad, &vp) == VT_ERR_INVALID_ARGUMENT && !vp,
               "video gemma4 sample_fps");
        v.rgb_len = 2;
        expect(vt_model_encode_video(m, &v, &set, &r, &vp) == VT_ERR_IMAGE && !r && !vp,
               "video short frame");
        v.rgb_len = 3;
        vt_image junk = {px, 3, VT_IMAGE_BYTES};
        v.rgb = NULL;
        v.frames = &junk;
        expect(vt_model_plan_video(m, &v, &set, &vp) == VT_ERR_IMAGE && !vp &&
                   vt_last_error_image() == 0,
               "video frame not an image");
        junk.kind = 9;
        expect(vt_model_plan_video(m, &v, &set, &vp) == VT_ERR_INVALID_ARGUMENT && !vp,
               "video frame kind");
        v.frames = NULL;
        v.rgb = px;
        size_t vneed = 7;
        expect(vt_model_encode_video_into(m, &v, &set, NULL, 4, &vneed, &vp) ==
                       VT_ERR_NULL_ARGUMENT && vneed == 7 && !vp,
               "video_into out NULL with a length");
        expect(vt_model_encode_video_into(m, &v, &set, (float *)((char *)buf + 1), 2, &vneed,
                                          &vp) == VT_ERR_INVALID_ARGUMENT && vneed == 7 && !vp,
               "video_into misaligned");
        expect(vt_model_encode_video_into(NULL, &v, &set, buf, 4, &vneed, &vp) ==
                       VT_ERR_NULL_ARGUMENT && vneed == 7 && !vp,
               "video_into model");
        expect(vt_model_encode_video_device(NULL, &v, &set, buf, 4, VT_DTYPE_F32, NULL, &vneed,
                                            &vp) == VT_ERR_NULL_ARGUMENT && vneed == 7 && !vp,
               "video_device model");
        expect(vt_model_encode_video_device(m, &v, &set, NULL, 0, 9, NULL, &vneed, &vp) ==
                       VT_ERR_INVALID_ARGUMENT && vneed == 7 && !vp,
               "video_device dtype");
        if (vt_model_device_ordinal(m) < 0) {
            /* The device checks come first, as in vt_model_encode_device: a CPU model refuses
             * whatever the buffer (4 floats is short for this video), *needed untouched. */
            expect(vt_model_encode_video_device(m, &v, &set, buf, 4, VT_DTYPE_F32, NULL, &vneed,
                                                &vp) == VT_ERR_UNSUPPORTED && vneed == 7 && !vp &&
                       strstr(vt_last_error(), "CUDA") != NULL,
                   "video_device on a CPU model");
            expect(vt_model_encode_video_device(m, &v, &set, NULL, 0, VT_DTYPE_BF16, NULL, &vneed,
                                                &vp) == VT_ERR_UNSUPPORTED && vneed == 7 && !vp,
                   "video_device on a CPU model, NULL dst");
        }
        expect(vt_model_encode_video(m, &v, &set, &r, NULL) == VT_OK && r, "video ok, no plan");
        vt_rows_free(r);
        r = NULL;
        expect(vt_model_encode_video(m, &v, &set, &r, &vp) == VT_OK && r && vp &&
                   vt_rows_count(r) == vt_video_plan_rows(vp),
               "video ok");
        vt_rows_free(r);
        r = NULL;
        vt_video_plan_free(vp);
        expect(vt_video_plan_rows(NULL) == 0 && vt_video_plan_piece_count(NULL) == 0 &&
                   !vt_video_plan_piece_ids(NULL) && !vt_video_plan_piece_counts(NULL) &&
                   !vt_video_plan_piece_embeds(NULL) && !vt_video_plan_piece_is_text(NULL) &&
                   !vt_video_plan_piece_text(NULL, 0) && vt_video_plan_frame_count(NULL) == 0 &&
                   !vt_video_plan_frames_indices(NULL) && !vt_video_plan_timestamps(NULL) &&
                   !vt_video_plan_grid(NULL) && vt_video_plan_target_width(NULL) == 0 &&
                   vt_video_plan_target_height(NULL) == 0,
               "video plan getters NULL");
        vt_video_settings d = vt_video_settings_default();
        expect(d.sample_fps == 0 && d.num_frames == 0 && d.max_soft_tokens == 0, "video defaults");
    }
    vt_tensors_free(t);
    /* every _free accepts NULL */
    vt_model_free(NULL);
    vt_plan_free(NULL);
    vt_video_plan_free(NULL);
    vt_rows_free(NULL);
    vt_tensors_free(NULL);
    /* a success clears the message */
    expect(vt_model_plan(m, &l.images[0], &p) == VT_OK && p, "plan ok");
    expect(vt_last_error()[0] == 0 && vt_last_error_image() == -1, "message cleared");
    vt_plan_free(p);
    expect(strcmp(vt_status_name(VT_ERR_IMAGE), "VT_ERR_IMAGE") == 0, "status name");
    expect(strcmp(vt_status_name(999), "VT_UNKNOWN_STATUS") == 0, "status name unknown");
    printf("\t%s\n", null_failures ? "FAILED" : "ok");
    free_images(&l);
}

/* panic: the library's test hook panics inside its guard */
vt_status vt_testing_panic(void);
static void cmd_panic(void) {
    vt_status s = vt_testing_panic();
    printf("panic\t%s", vt_status_name(s));
    print_message();
}

static void cmd_version(void) {
    printf("version\t%s\t%u\t%u\n", vt_version(), vt_abi_version(), (unsigned)VT_ABI_VERSION);
}

int main(int argc, char **argv) {
    if (argc != 2) die("usage: vt_ctest SCRIPT");
    size_t len;
    char *script = (char *)read_file(argv[1], &len);
    script = realloc(script, len + 1);
    if (!script) die("out of memory");
    script[len] = 0;
    char *save_line = NULL;
    for (char *line = strtok_r(script, "\n", &save_line); line;
         line = strtok_r(NULL, "\n", &save_line)) {
        char *f[MAX_FIELDS] = {0};
        size_t n = 0;
        for (char *p = line; p && n < MAX_FIELDS;) {
            f[n++] = p;
            p = strchr(p, '\t');
            if (p) *p++ = 0;
        }
        const char *c = n ? f[0] : "";
        if (!strcmp(c, "open")) cmd_open(f, n);
        else if (!strcmp(c, "free")) cmd_free(f, n);
        else if (!strcmp(c, "plan")) cmd_plan(f, n);
        else if (!strcmp(c, "encode")) cmd_encode(f, n);
        else if (!strcmp(c, "encode_into")) cmd_encode_into(f, n);
        else if (!strcmp(c, "video")) cmd_video(f, n);
        else if (!strcmp(c, "tensors_new")) cmd_tensors_new();
        else if (!strcmp(c, "tensor_f32")) cmd_tensor(f, n, 1);
        else if (!strcmp(c, "tensor_i64")) cmd_tensor(f, n, 0);
        else if (!strcmp(c, "encode_tensors")) cmd_encode_tensors(f, n);
        else if (!strcmp(c, "encode_device")) cmd_encode_device(f, n);
        else if (!strcmp(c, "encode_tensors_device")) cmd_encode_tensors_device(f, n);
        else if (!strcmp(c, "oom")) cmd_oom(f, n);
        else if (!strcmp(c, "threads")) cmd_threads(f, n);
        else if (!strcmp(c, "nulls")) cmd_nulls(f, n);
        else if (!strcmp(c, "panic")) cmd_panic();
        else if (!strcmp(c, "version")) cmd_version();
        else die("unknown command");
        fflush(stdout);
    }
    for (int i = 0; i < MAX_SLOTS; i++) vt_model_free(slots[i]);
    vt_tensors_free(tensors);
    cuda_teardown();
    free(script);
    return 0;
}
