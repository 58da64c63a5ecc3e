/* The built-in input of `seqflow run`: a few paragraphs of plain English, so that a first run
 * needs no file. */
#include "stages/builtin_text.h"

static const char text[] =
    "Streams do not end. A log, a conversation, a sensor, a book read aloud: each arrives one\n"
    "token after another, and a model that must wait for the end before it answers never\n"
    "answers at all. seqflow cuts the stream into segments, lets every token attend to its\n"
    "neighbours through dilated windows of several widths, folds everything older into a\n"
    "small compressive memory, and carries a handful of summary tokens from segment to\n"
    "segment, so that the state it keeps stays the same size however long the stream runs.\n"
    "\n"
    "The first branch looks closely at a short window; the next looks twice as far but at\n"
    "every second token; the last sees the whole segment through a coarse dilation. Their\n"
    "answers are merged by their softmax denominators, which is exactly attention over the\n"
    "union of the keys they reach. What falls out of every window is not forgotten: the\n"
    "memory keeps an associative matrix of keys and values, updated by the delta rule so\n"
    "that it stores what it did not already predict.\n"
    "\n"
    "Run it on a file with --input, on standard input with --input -, and write the hidden\n"
    "states with --out. The same pipeline runs on a GPU, across the GPUs of a node, and\n"
    "across nodes, and every layout must give the same answer as this one process.\n";

const char *sf_builtin_text(void) { return text; }
size_t sf_builtin_text_length(void) { return sizeof text - 1; }
