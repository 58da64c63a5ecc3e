/* The stage registry that the textual pipeline form looks names up in. Built-in classes are
 * always present; applications add their own with sf_register_stage before parsing. */
#include <pthread.h>
#include <string.h>

#include "pipeline/graph_internal.h"

#define MAX_CUSTOM_STAGES 64

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static const sf_stage_class *custom_stages[MAX_CUSTOM_STAGES];
static int n_custom_stages;

const sf_stage_class *sf_find_stage(const char *name)
{
    if (!name) return NULL;
    for (int i = 0; sf_builtin_stages[i]; i++)
        if (strcmp(sf_builtin_stages[i]->name, name) == 0) return sf_builtin_stages[i];
    const sf_stage_class *found = NULL;
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < n_custom_stages && !found; i++)
        if (strcmp(custom_stages[i]->name, name) == 0) found = custom_stages[i];
    pthread_mutex_unlock(&registry_lock);
    return found;
}

int sf_register_stage(const sf_stage_class *cls)
{
    if (!cls || !cls->name || !*cls->name || (!cls->process && !cls->generate))
        return sf_error(SF_E_INVAL, "a stage class needs a name and process or generate");
    if (sf_find_stage(cls->name))
        return sf_error(SF_E_INVAL, "a stage named '%s' is already registered", cls->name);
    pthread_mutex_lock(&registry_lock);
    int rc = SF_OK;
    if (n_custom_stages == MAX_CUSTOM_STAGES)
        rc = sf_error(SF_E_NOMEM, "at most %d custom stages can be registered", MAX_CUSTOM_STAGES);
    else
        custom_stages[n_custom_stages++] = cls;
    pthread_mutex_unlock(&registry_lock);
    return rc;
}

void sf_foreach_stage(void (*fn)(const sf_stage_class *cls, void *user), void *user)
{
    for (int i = 0; sf_builtin_stages[i]; i++) fn(sf_builtin_stages[i], user);
    pthread_mutex_lock(&registry_lock);
    int n = n_custom_stages;
    const sf_stage_class *copy[MAX_CUSTOM_STAGES];
    memcpy(copy, custom_stages, sizeof copy);
    pthread_mutex_unlock(&registry_lock);
    for (int i = 0; i < n; i++) fn(copy[i], user);
}
