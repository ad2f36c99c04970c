/*
 * video: open a model, encode one video from its frame files, print its prompt and rows.
 *
 *   cc -std=c99 -I crates/vision-towers-c/include crates/vision-towers-c/examples/c/video.c \
 *      -L target/release -lvision_towers_c -Wl,-rpath,"$PWD/target/release" -o video
 *   ffmpeg -i v.mp4 frames/%06d.png
 *   ./video fixtures/models/glm5_next 30 frames/[0-9]*.png
 *
 * Every frame of the video is handed in, in order, with its frame rate; the model's video
 * processor samples them (glm5_next, gemma4) and only the sampled frames are read. A real engine
 * would keep the files mapped or read them lazily; this example reads them all.
 */
#include "vision_towers.h"

#include <stdio.h>
#include <stdlib.h>

static int fail(const char *call, vt_status s) {
    fprintf(stderr, "%s: %s: %s\n", call, vt_status_name(s), vt_last_error());
    return 1;
}

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = n > 0 ? (size_t)n : 0;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL FPS FRAME...\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)(argc - 3);
    vt_image *frames = calloc(n, sizeof(vt_image));
    if (!frames) return 2;
    for (size_t i = 0; i < n; i++) {
        unsigned char *b = read_file(argv[3 + i], &frames[i].len);
        if (!b) {
            fprintf(stderr, "cannot read %s\n", argv[3 + i]);
            return 2;
        }
        frames[i].data = b;
        frames[i].kind = VT_IMAGE_BYTES;
    }
    vt_open_options opts = vt_open_options_default();
    opts.device = "cpu";
    vt_model *model = NULL;
    vt_status s = vt_model_open(argv[1], &opts, &model);
    if (s != VT_OK) return fail("vt_model_open", s);

    vt_video video = {0};
    video.frames = frames;
    video.n_frames = n;
    video.fps = atof(argv[2]);
    vt_video_settings settings = vt_video_settings_default();
    vt_rows *rows = NULL;
    vt_video_plan *plan = NULL;
    /* Host f32 rows; vt_model_encode_video_device writes them into a CUDA buffer on a stream of
     * yours instead (a model opened on "cuda"). */
    s = vt_model_encode_video(model, &video, &settings, &rows, &plan);
    int rc = 0;
    if (s != VT_OK) {
        rc = fail("vt_model_encode_video", s);
    } else {
        printf("family %s frames %zu sampled %zu rows %llu width %zu\n",
               vt_model_family_name(model), n, vt_video_plan_frame_count(plan),
               (unsigned long long)vt_video_plan_rows(plan), vt_rows_width(rows));
        /* The prompt: token runs (the ones marked embed take the rows, in order) and text. */
        for (size_t i = 0; i < vt_video_plan_piece_count(plan); i++) {
            if (vt_video_plan_piece_is_text(plan)[i])
                printf("  text \"%s\"\n", vt_video_plan_piece_text(plan, i));
            else
                printf("  %s x %llu%s\n", vt_video_plan_piece_text(plan, i),
                       (unsigned long long)vt_video_plan_piece_counts(plan)[i],
                       vt_video_plan_piece_embeds(plan)[i] ? " <- rows" : "");
        }
        printf("first value %g\n", (double)vt_rows_data(rows)[0]);
    }
    vt_rows_free(rows);
    vt_video_plan_free(plan);
    vt_model_free(model);
    for (size_t i = 0; i < n; i++) free((void *)frames[i].data);
    free(frames);
    return rc;
}
