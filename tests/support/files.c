#include "support/files.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

unsigned char *check_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    unsigned char *buf = malloc((size_t)n + 1);
    *len = fread(buf, 1, (size_t)n, f);
    buf[*len] = 0;
    fclose(f);
    return buf;
}

int check_path_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

int check_same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

int check_count_files(const char *dir, const char *descend_prefix)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        int inner = -1;
        if (descend_prefix && strncmp(de->d_name, descend_prefix, strlen(descend_prefix)) == 0) {
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name);
            inner = check_count_files(sub, descend_prefix);
        }
        n += inner >= 0 ? inner : 1;
    }
    closedir(d);
    return n;
}
