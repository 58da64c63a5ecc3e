/* pipeline/zap.h: read a ZAP request's frames, ask, reply (RFC 27: version, request id, status
 * code, status text, user id, metadata). */
#include <string.h>
#include <zmq.h>

#include "pipeline/zap.h"

int sf_zap_answer(void *zap, sf_zap_decide decide, void *user, const char *refusal)
{
    int refused = 0;
    for (;;) {
        zmq_msg_t part[8];
        int count = 0, more = 1;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, zap, count ? 0 : ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                if (!count) return refused;
                break;
            }
            more = zmq_msg_more(&m);
            if (count < 8) part[count++] = m;
            else zmq_msg_close(&m);
        }
        /* frames: version, request id, domain, address, identity, mechanism, credentials... */
        sf_zap_request r = {"", "", NULL};
        char uid[64] = "";
        int ok = 0;
        if (count >= 6) {
            size_t len = zmq_msg_size(&part[5]);
            if (len < sizeof r.mechanism) memcpy(r.mechanism, zmq_msg_data(&part[5]), len), r.mechanism[len] = 0;
            len = zmq_msg_size(&part[3]);
            if (len < sizeof r.address) memcpy(r.address, zmq_msg_data(&part[3]), len), r.address[len] = 0;
            if (strcmp(r.mechanism, "CURVE") == 0 && count >= 7 && zmq_msg_size(&part[6]) == 32)
                r.key = zmq_msg_data(&part[6]);
            ok = decide(user, &r, uid, sizeof uid);
        }
        if (!ok) refused++;
        const char *status = ok ? "200" : "400", *text = ok ? "OK" : refusal;
        zmq_send(zap, "1.0", 3, ZMQ_SNDMORE);
        if (count >= 2) zmq_send(zap, zmq_msg_data(&part[1]), zmq_msg_size(&part[1]), ZMQ_SNDMORE);
        else zmq_send(zap, "", 0, ZMQ_SNDMORE);
        zmq_send(zap, status, 3, ZMQ_SNDMORE);
        zmq_send(zap, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(zap, uid, strlen(uid), ZMQ_SNDMORE);
        zmq_send(zap, "", 0, 0);
        for (int i = 0; i < count; i++) zmq_msg_close(&part[i]);
    }
}
